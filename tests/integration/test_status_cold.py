"""A cold ``gpubot status``, run as a real process on the simulated fleet: what it imports, that
it records the query, and that a database it cannot use fails it exactly as it always did.

The audit store opens in a worker thread while the nodes are probed; these tests check the
behaviour that must not change with that, not its speed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpubot.store.version import HEAD
from gpusim.fleet import SimFleet

# Runs the ``gpubot`` command line, then prints the modules the process imported on stderr.
WRAPPER = """
import json, sys
from gpubot.cli import main
code = main(sys.argv[1:])
print("MODULES " + json.dumps(sorted(sys.modules)), file=sys.stderr)
raise SystemExit(code)
"""
# What a status call must not load: migrations, Slack, the scheduler, the metrics, and the
# parts of gpubot that only the bot, a reset or a sweep use.
NOT_IMPORTED = (
    "alembic",
    "slack_bolt",
    "slack_sdk",
    "aiohttp",
    "apscheduler",
    "prometheus_client",
    "gpubot.store.migrate",
    "gpubot.slack",
    "gpubot.chat",
    "gpubot.scheduler",
    "gpubot.metrics",
    "gpubot.services.reset",
    "gpubot.services.sweep",
    "gpubot.services.approvals",
)
# Reading the settings checks their chat ids with the front end's own id forms: a table of
# patterns, no Slack library (the entry registers them before settings are read).
ID_FORMS = frozenset({"gpubot.slack", "gpubot.slack.ids"})
BEHIND = f"gpubot: error: database is at 0002, this gpubot needs {HEAD}: run `gpubot db upgrade`"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(tmp_path_factory.mktemp("cold"), nodes=3, gpus=2) as f:
        assert gpubot(f.config_path, "db", "upgrade").returncode == 0
        yield f


def gpubot(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``gpubot --config CONFIG ARGS`` (through the wrapper that lists its modules)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUBOT_")}
    return subprocess.run(
        [sys.executable, "-c", WRAPPER, "--config", str(config), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def modules(p: subprocess.CompletedProcess[str]) -> list[str]:
    (line,) = [ln for ln in p.stderr.splitlines() if ln.startswith("MODULES ")]
    names: list[str] = json.loads(line.removeprefix("MODULES "))
    return names


def loaded(names: list[str], prefix: str) -> bool:
    return any(n == prefix or n.startswith(prefix + ".") for n in names)


def messages(p: subprocess.CompletedProcess[str]) -> list[str]:
    return [ln for ln in p.stderr.splitlines() if not ln.startswith("MODULES ")]


def with_database(fleet: SimFleet, tmp_path: Path, url: str) -> Path:
    """Write a copy of the fleet's settings that uses the database at ``url``."""
    text = fleet.config_path.read_text()
    old = next(ln for ln in text.splitlines() if ln.startswith("url = "))
    config = tmp_path / "gpubot.toml"
    config.write_text(text.replace(old, f'url = "{url}"'))
    return config


def queries(config: Path) -> list[dict[str, Any]]:
    p = gpubot(config, "audit", "list", "--queries", "--json", "--limit", "1000")
    assert p.returncode == 0, p.stderr
    out: list[dict[str, Any]] = json.loads(p.stdout)
    return out


def answered_all(p: subprocess.CompletedProcess[str], fleet: SimFleet) -> None:
    doc = json.loads(p.stdout)
    assert [n["name"] for n in doc["nodes"]] == [n.name for n in fleet.nodes]
    assert all(n["ok"] and len(n["gpus"]) == fleet.gpus for n in doc["nodes"]), doc


def test_status_imports_no_slack_alembic_scheduler_or_metrics_and_records_the_query(
    fleet: SimFleet,
) -> None:
    before = {q["seq"] for q in queries(fleet.config_path)}
    p = gpubot(fleet.config_path, "status", "all", "--json")
    assert p.returncode == 0, p.stderr
    answered_all(p, fleet)
    assert messages(p) == []
    names = [n for n in modules(p) if n not in ID_FORMS]
    assert [m for m in NOT_IMPORTED if loaded(names, m)] == []
    assert loaded(names, "sqlalchemy")  # it writes the audit record: that needs the store
    (record,) = [q for q in queries(fleet.config_path) if q["seq"] not in before]
    assert record["payload"]["query"] == "status" and record["source"] == "cli"
    assert record["payload"]["nodes"] == [n.name for n in fleet.nodes]
    assert record["payload"]["failed"] == {} and record["actor"].startswith("cli:")


def test_a_database_that_cannot_be_opened_warns_and_the_fleet_still_answers(
    fleet: SimFleet, tmp_path: Path
) -> None:
    config = with_database(fleet, tmp_path, f"sqlite:///{tmp_path}/missing/dir/audit.db")
    p = gpubot(config, "status", "all", "--json")
    assert p.returncode == 0, p.stderr
    answered_all(p, fleet)
    (line,) = messages(p)  # a log line: ISO 8601 UTC time, level, logger (gpubot.cli.logs)
    time_, rest = line.split(" ", 1)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", time_), line
    assert rest == (
        "WARNING gpubot.app: audit log unavailable, this query is not recorded: "
        "cannot open the database: unable to open database file"
    )


@pytest.mark.parametrize("targets", [("all", "--json"), ("node1",), ("nodeX",)])
def test_a_database_behind_stops_status_before_it_answers(
    fleet: SimFleet, tmp_path: Path, targets: tuple[str, ...]
) -> None:
    config = with_database(fleet, tmp_path, f"sqlite:///{tmp_path}/behind.db")
    assert gpubot(config, "db", "upgrade").returncode == 0
    assert gpubot(config, "db", "downgrade", "0002").returncode == 0
    p = gpubot(config, "status", *targets)
    assert p.returncode == 2
    assert p.stdout == ""  # no table, no JSON: nothing was answered
    assert messages(p) == [BEHIND]  # also before an unknown node's error, as it always was


def test_a_new_sqlite_database_is_set_up_and_the_query_recorded(
    fleet: SimFleet, tmp_path: Path
) -> None:
    config = with_database(fleet, tmp_path, f"sqlite:///{tmp_path}/new.db")
    p = gpubot(config, "status", "node2", "--json")
    assert p.returncode == 0, p.stderr
    assert messages(p) == []
    (record,) = queries(config)
    assert record["payload"]["nodes"] == ["node2"] and record["node"] == "node2"
