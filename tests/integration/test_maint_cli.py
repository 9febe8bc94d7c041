"""``gpubot maint`` on the simulated fleet: the CLI's user plans, lists and ends a window (as
on-call: it holds the settings and the database), each change audited as ``cli:<user>``; bad
input is one line, exit 2, and changes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpusim.fleet import SimFleet
from tests.fixtures.fleet import gpubot_cli as gpubot


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with SimFleet(tmp_path_factory.mktemp("maint-cli"), nodes=1, gpus=1) as sim:
        assert gpubot(sim.config_path, "db", "upgrade").returncode == 0
        yield sim.config_path


def test_plan_list_and_end_a_window_audited(config: Path) -> None:
    words = ["node1", "from", "tomorrow", "02:00", "for", "4h", "because", "kernel", "update"]
    planned = gpubot(config, "maint", *words)
    assert planned.returncode == 0, planned.stderr
    assert "planned #" in planned.stdout and "kernel update, by cli:" in planned.stdout
    listed = gpubot(config, "maint", "--json")
    assert listed.returncode == 0, listed.stderr
    (w,) = json.loads(listed.stdout)["windows"]
    assert (w["node"], w["reason"]) == ("node1", "kernel update")
    ended = gpubot(config, "maint", "end", "node1")
    assert ended.returncode == 0 and "ended #" in ended.stdout, ended.stderr
    assert json.loads(gpubot(config, "maint", "--json").stdout)["windows"] == []
    records = json.loads(gpubot(config, "audit", "list", "--json").stdout)
    maint = [r for r in records if r.get("kind") == "maint"]
    assert len(maint) == 2 and all(r["actor"].startswith("cli:") for r in maint), maint


@pytest.mark.parametrize(
    ("words", "says"),
    [
        (["node1", "in", "3h"], "usage"),
        (["node9", "from", "now", "for", "1h", "because", "x"], "node9"),
        (["node1", "from", "now", "for", "99d", "because", "x"], "at most"),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(
    config: Path, words: list[str], says: str
) -> None:
    got = gpubot(config, "maint", *words)
    assert got.returncode == 2 and "Traceback" not in got.stderr
    assert len(got.stderr.strip().splitlines()) == 1 and says in got.stderr.lower(), got.stderr
    assert json.loads(gpubot(config, "maint", "--json").stdout)["windows"] == []
