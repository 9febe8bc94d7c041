"""A driver that gives no ``Device Minor`` (older drivers): the node's answer says, in words,
what gpubot cannot see there, in the terminal, in ``status --json`` and in Block Kit."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpubot.chat.fleet_view import render_node
from gpubot.services.reset import ResetService
from gpubot.slack.render import to_slack
from gpusim.fleet import SimFleet, SimNode
from tests.fixtures.fleet import leave_clean, reset_fixtures, status_notes

SAYS = "device file unknown for GPU 1"
WHY = "cannot see who holds that device file"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(tmp_path_factory.mktemp("blind"), nodes=1, gpus=2, release_delay_s=0.3) as f:
        yield f


settings, store, engine, node = reset_fixtures()


def _information(node: SimNode, gpu: int) -> Path:
    bus = node.state()["gpus"][gpu]["bus_id"].split(":", 1)
    return (
        Path(node.driver_dir) / "gpus" / f"{int(bus[0], 16):04x}:{bus[1].lower()}" / "information"
    )


@pytest.fixture
def blind(node: SimNode) -> Iterator[SimNode]:
    """GPU 1's information file without its ``Device Minor`` line, as older drivers write it."""
    path = _information(node, 1)
    text = path.read_text(encoding="utf-8")
    assert "Device Minor:" in text
    path.write_text("".join(ln for ln in text.splitlines(True) if "Device Minor" not in ln))
    try:
        yield node
    finally:
        path.write_text(text, encoding="utf-8")
        leave_clean(node)


async def test_the_node_answer_says_what_gpubot_cannot_see(
    blind: SimNode, fleet: SimFleet, engine: ResetService
) -> None:
    hidden = blind.spawn(gpu=1, mib=500, behaviour="hidden")  # only its device file tells
    snap = await engine.status.snapshot(engine.status.node("node1"))
    assert [(g.index, g.minor) for g in snap.gpus] == [(0, 0), (1, None)]
    assert hidden.pid not in {p.pid for p in snap.processes}  # what the note warns of
    text, doc = status_notes(fleet.config_path, "node1")
    assert SAYS in text and WHY in " ".join(text.split())
    assert "device-file-unknown" in doc["gpus"][1]["flags"]
    (note,) = [n for n in doc["notes"] if n.startswith(SAYS)]
    assert WHY in note and "a reset cannot find or wait for holders by device file" in note
    assert [g["device_minor"] for g in doc["gpus"]] == [0, None]
    blocks = json.dumps(to_slack(render_node(snap))["blocks"])
    assert SAYS in blocks and WHY in blocks


async def test_no_note_where_every_minor_is_known(
    node: SimNode, fleet: SimFleet, engine: ResetService
) -> None:
    """Control: the same node with the driver's Device Minor lines says nothing of the kind."""
    snap = await engine.status.snapshot(engine.status.node("node1"))
    assert [g.minor for g in snap.gpus] == [0, 1]
    text, doc = status_notes(fleet.config_path, "node1")
    assert SAYS not in text and not any("device file unknown" in n for n in doc["notes"])
    assert "device file unknown" not in json.dumps(to_slack(render_node(snap))["blocks"])
