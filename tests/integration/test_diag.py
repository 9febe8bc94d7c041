"""``/gpu diag`` on the simulated fleet, over real SSH: without DCGM one clear line, audited (the
control); with a ``dcgmi`` stand-in on the node's session PATH that prints a recorded real
document, the per-test table, audited."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpubot.chat.diag_view import diag_text, render_diag
from gpubot.core import commands
from gpubot.services.diag import DiagFailed, DiagRun, DiagService
from gpubot.services.reset import Ask, ResetService
from gpubot.store import Store
from gpusim.fleet import SimFleet
from tests.fixtures.corpus import CORPUS
from tests.fixtures.dcgmi import install
from tests.fixtures.fleet import reset_fixtures

RECORDED = CORPUS / "diag" / "dcgm-testdiagmanager-per-gpu.json"
HOSTENGINE_DOWN = "Error: unable to establish a connection to the specified host: localhost"


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dcgm-bin")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, bin_dir: Path) -> Iterator[SimFleet]:
    with SimFleet(
        tmp_path_factory.mktemp("diag"), nodes=1, gpus=4, session_path=[str(bin_dir)]
    ) as f:
        yield f


settings, store, engine, node = reset_fixtures()


@pytest.fixture
def stand_in(bin_dir: Path) -> Iterator[Path]:
    """Where the ``dcgmi`` stand-in goes (removed after each test: no DCGM by default)."""
    path = bin_dir / "dcgmi"
    yield path
    path.unlink(missing_ok=True)


def diag(engine: ResetService) -> DiagService:
    return DiagService(engine.settings, engine.transport, engine.store, engine.status, engine.locks)


async def test_without_dcgm_one_clear_line_audited(
    engine: ResetService, store: Store, stand_in: Path
) -> None:
    assert not stand_in.exists()
    with pytest.raises(DiagFailed) as err:
        await diag(engine).run(Ask.by("u1", "test", "/gpu diag node1 gpu 2"), "node1", 2)
    line = str(err.value)
    assert line.startswith("no diagnostic on node1: dcgmi is not installed") and "\n" not in line
    (a,) = await store.actions(node="node1", limit=1)
    assert (a.kind, a.status, a.gpus) == ("diag", "error", (2,))
    assert f"audit #{a.id}" in line


async def test_a_stopped_hostengine_is_named(
    engine: ResetService, store: Store, stand_in: Path
) -> None:
    install(stand_in, said=HOSTENGINE_DOWN, status=255)
    with pytest.raises(DiagFailed, match="nv-hostengine is not running"):
        await diag(engine).run(Ask.by("u1", "test", "/gpu diag node1 gpu 2"), "node1", 2)
    (a,) = await store.actions(node="node1", limit=1)
    assert (a.kind, a.status) == ("diag", "error")


async def test_a_recorded_document_is_parsed_rendered_and_audited(
    engine: ResetService, store: Store, stand_in: Path
) -> None:
    install(stand_in, stdout=RECORDED)
    ask = Ask.by("u1", "test", "/gpu diag node1 gpu 2 medium")
    run = await diag(engine).run(ask, "node1", 2, "medium")
    argv = Path(f"{stand_in}.argv").read_text().split()
    assert argv == ["diag", "-r", "2", "-i", "2", "-j"]  # dcgmi's own argv, no sudo
    assert run.verdict == "fail" and len(run.rows) == 17
    text = "\n".join(diag_text(run))
    assert "sm_stress" in text and "FAIL" in text and "1096.5" in text
    msg = render_diag(run, "U1")
    assert msg.title is not None and "FAILED" in msg.title
    assert msg.fallback is not None and "sm_stress" in msg.fallback
    (a,) = await store.actions(node="node1", limit=1)
    assert (a.kind, a.status, a.gpus, a.id) == ("diag", "done", (2,), run.action_id)
    assert json.loads(json.dumps(run.to_dict()))["verdict"] == "fail"


async def test_a_passing_gpu_passes(engine: ResetService, stand_in: Path) -> None:
    install(stand_in, stdout=RECORDED)
    run: DiagRun = await diag(engine).run(Ask.by("u1", "t", "t"), "node1", 1)
    assert run.verdict == "pass" and {r.status for r in run.rows} == {"pass", "skip"}


def test_the_command_parses_as_chat_types_it() -> None:
    assert commands.parse("/gpu diag node1 gpu 2") == commands.Diag("node1", 2, "quick")
    assert commands.parse("/gpu diag node1 gpu 2 medium").level == "medium"  # type: ignore[union-attr]
