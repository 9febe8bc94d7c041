"""First use: ``gpubot status`` on a fresh SQLite path sets the database up (no ``db upgrade``);
on a PostgreSQL database never migrated it stops with one line naming ``gpubot db upgrade``."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpusim.fleet import SimFleet
from tests.fixtures.db import temp_database


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(tmp_path_factory.mktemp("first-use"), nodes=2, gpus=2) as f:
        yield f


def settings_with(fleet: SimFleet, folder: Path, url: str) -> Path:
    path = folder / "gpubot.toml"
    text = re.sub(r'(?m)^url = ".*"$', f'url = "{url}"', fleet.config_path.read_text(), count=1)
    path.write_text(text, encoding="utf-8")
    return path


def gpubot(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GPUBOT_CONFIG", "GPUBOT_AUDIT_KEY")}
    return subprocess.run(
        [sys.executable, "-m", "gpubot", "--config", str(config), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
    )


def test_status_on_a_fresh_sqlite_path_sets_the_database_up(
    fleet: SimFleet, tmp_path: Path
) -> None:
    db = tmp_path / "state" / "gpubot.db"
    db.parent.mkdir()
    cfg = settings_with(fleet, tmp_path, f"sqlite:///{db}")
    p = gpubot(cfg, "status")
    assert (p.returncode, p.stderr) == (0, "")
    assert "node1" in p.stdout and "node2" in p.stdout
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    p = gpubot(cfg, "audit", "list", "--queries", "--json")
    assert p.returncode == 0, p.stderr
    [query] = json.loads(p.stdout)
    assert (query["payload"]["query"], query["payload"]["nodes"]) == ("status", ["node1", "node2"])
    p = gpubot(cfg, "db", "current")
    assert p.returncode == 0 and "(what this gpubot needs)" in p.stdout


def test_status_on_a_postgresql_database_never_migrated_names_the_command(
    fleet: SimFleet, tmp_path: Path
) -> None:
    with temp_database("postgresql", tmp_path, migrated=False) as url:
        cfg = settings_with(fleet, tmp_path, url)
        p = gpubot(cfg, "status")
        assert (p.returncode, p.stdout) == (2, "")
        assert "Traceback" not in p.stderr and p.stderr.count("\n") == 1
        assert p.stderr.startswith("gpubot: error: database is at base (empty)")
        assert p.stderr.rstrip().endswith("run `gpubot db upgrade`")
        p = gpubot(cfg, "db", "upgrade")
        assert p.returncode == 0, p.stderr
        p = gpubot(cfg, "status")
        assert (p.returncode, p.stderr) == (0, "")
