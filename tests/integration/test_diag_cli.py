"""``gpubot diag NODE --gpu N [--level quick|medium] [--json]`` as a real process over real SSH
on the simulated fleet: with a ``dcgmi`` stand-in on the node's session PATH printing NVIDIA's
recorded document, the table or the document, the exit status by the verdict and the audit
record; without DCGM (the control) one line on stderr and exit 2, audited too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpusim.fleet import SimFleet
from tests.fixtures.corpus import CORPUS
from tests.fixtures.dcgmi import install
from tests.fixtures.fleet import gpubot_cli

RECORDED = CORPUS / "diag" / "dcgm-testdiagmanager-per-gpu.json"


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dcgm-cli-bin")


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory, bin_dir: Path) -> Iterator[Path]:
    where = tmp_path_factory.mktemp("diag-cli")
    with SimFleet(where, nodes=1, gpus=4, session_path=[str(bin_dir)]) as f:
        up = gpubot_cli(f.config_path, "db", "upgrade")
        assert up.returncode == 0, up.stderr
        yield f.config_path


@pytest.fixture
def stand_in(bin_dir: Path) -> Iterator[Path]:
    path = bin_dir / "dcgmi"
    yield path
    path.unlink(missing_ok=True)


def diag_records(config: Path) -> list[dict[str, object]]:
    listed = gpubot_cli(config, "audit", "list", "--kind", "diag", "--json")
    assert listed.returncode == 0, listed.stderr
    return list(json.loads(listed.stdout))


def test_a_failing_gpu_prints_its_table_and_exits_1(config: Path, stand_in: Path) -> None:
    install(stand_in, stdout=RECORDED)
    p = gpubot_cli(config, "diag", "node1", "--gpu", "2", "--level", "medium")
    assert p.returncode == 1, p.stderr
    assert Path(f"{stand_in}.argv").read_text().split() == ["diag", "-r", "2", "-i", "2", "-j"]
    lines = p.stdout.splitlines()
    assert lines[0] == "dcgmi diag node1 GPU 2 (medium): FAILED"
    assert any("sm_stress" in ln and "FAIL" in ln and "1096.5" in ln for ln in lines), p.stdout
    aid = diag_records(config)[0]["id"]
    assert lines[-1].endswith(f"audit #{aid}")


def test_a_passing_gpu_as_json_exits_0_and_is_audited(config: Path, stand_in: Path) -> None:
    install(stand_in, stdout=RECORDED)
    p = gpubot_cli(config, "diag", "node1", "--gpu", "1", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert (doc["node"], doc["gpu"], doc["level"], doc["verdict"]) == ("node1", 1, "quick", "pass")
    assert {t["status"] for t in doc["tests"]} == {"pass", "skip"}
    assert Path(f"{stand_in}.argv").read_text().split() == ["diag", "-r", "1", "-i", "1", "-j"]
    (record, *_) = diag_records(config)
    assert record["id"] == doc["audit_id"] and record["status"] == "done"
    assert str(record["command"]).endswith(" diag node1 --gpu 1 --json")
    assert str(record["actor"]).startswith("cli:") and record["source"] == "cli"


def test_control_without_dcgm_one_line_and_exit_2(config: Path, stand_in: Path) -> None:
    assert not stand_in.exists()
    p = gpubot_cli(config, "diag", "node1", "--gpu", "0")
    assert p.returncode == 2 and p.stdout == ""
    (line,) = p.stderr.splitlines()
    assert line.startswith("gpubot: error: no diagnostic on node1: dcgmi is not installed"), line
    (record, *_) = diag_records(config)
    assert record["status"] == "error" and line.endswith(f"(audit #{record['id']})")


def test_a_bad_level_is_refused_before_anything_runs(config: Path) -> None:
    p = gpubot_cli(config, "diag", "node1", "--gpu", "0", "--level", "long")
    assert p.returncode == 2 and "invalid choice: 'long'" in p.stderr
    assert "Traceback" not in p.stderr
