"""A sweep whose database fails: every store error is said in one line and the sweep stands.

The failures are real: a table of the sweep's SQLite database renamed away (reads and writes
fail) or a trigger that refuses one kind of write. The CLI runs as a real process
(``gpubot sweep``); the scheduled sweep and alerting run in-process on ``gpubot.app.build``.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpubot.app import build
from gpubot.config import load
from gpubot.store import open_store
from gpusim.fleet import SimFleet, SimNode
from tests.fixtures.fleet import gpubot_cli, leave_clean
from tests.procs import wait_dead


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(tmp_path_factory.mktemp("sweep-db"), nodes=1, gpus=2, release_delay_s=0.3) as f:
        yield f


@pytest.fixture
def node(fleet: SimFleet) -> Iterator[SimNode]:
    n = fleet.node("node1")
    yield n
    leave_clean(n)


@pytest.fixture
def config(fleet: SimFleet, tmp_path: Path) -> Path:
    """The fleet's settings on a database of the test's own, migrated, in ``tmp_path``."""
    db = tmp_path / "sweep.db"
    path = tmp_path / "gpubot.toml"
    path.write_text(_with_db(fleet.config_path.read_text(), db))
    store = open_store(f"sqlite:///{db}", check_schema=False)
    store.upgrade()
    store.close()
    return path


def _with_db(text: str, db: Path) -> str:
    """Point a settings file's ``[database] url`` at ``db``."""
    out, n = re.subn(r'^url = "sqlite:[^"]*"$', f'url = "sqlite:///{db}"', text, flags=re.M)
    assert n == 1, text
    return out


def _sql(config: Path, *statements: str) -> None:
    db = config.with_name("sweep.db")
    conn = sqlite3.connect(db)
    try:
        for s in statements:
            conn.execute(s)
        conn.commit()
    finally:
        conn.close()


def _orphan(node: SimNode) -> None:
    """Leave orphaned VRAM on GPU 1 (a finding for every sweep)."""
    w = node.spawn(gpu=1, mib=2048, behaviour="orphan")
    os.kill(w.pid, signal.SIGKILL)
    wait_dead(w.pid)


def _warnings(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    return [ln for ln in stderr.splitlines() if ln.strip()]


@pytest.mark.parametrize(
    ("table", "said"),
    [
        (
            "audit_log",
            [
                "sweep not recorded in the audit log: cannot record the query: "
                "no such table: audit_log"
            ],
        ),
        # samples and idle runs are one transaction: one line says both
        ("gpu_samples", ["GPU samples not stored, idle GPUs not looked for: "]),
        ("alerts", ["alert state unavailable: "]),
    ],
)
def test_a_cli_sweep_says_each_store_error_and_still_reports(
    config: Path, node: SimNode, table: str, said: list[str]
) -> None:
    _orphan(node)
    node.spawn(gpu=0, mib=8192, util_pct=0)  # held at 0 %: its history is read from samples
    _sql(config, f"ALTER TABLE {table} RENAME TO {table}_gone")
    p = gpubot_cli(config, "sweep")
    assert p.returncode == 1, p.stderr  # a finding: orphaned VRAM
    assert "node1  GPU 1  orphaned-vram" in p.stdout
    lines = _warnings(p.stderr)
    for words in said:
        hits = [ln for ln in lines if words in ln]
        assert len(hits) == 1, (words, lines)
        assert f"no such table: {table}" in hits[0]


async def test_a_scheduled_sweep_that_cannot_read_the_audit_log_is_skipped(
    config: Path, node: SimNode, caplog: pytest.LogCaptureFixture
) -> None:
    _sql(config, "ALTER TABLE audit_log RENAME TO audit_log_gone")
    app = build(load(config), {}, need_store=True)
    try:
        with caplog.at_level(logging.WARNING):
            result = await app.sweep.scheduled()
    finally:
        await app.close()
    assert result.skipped is not None and "no such table: audit_log" in result.skipped
    assert result.findings == () and result.snapshots == ()
    assert any(r.getMessage() == f"sweep skipped: {result.skipped}" for r in caplog.records)


async def test_alert_state_that_cannot_be_written_leaves_the_findings(
    config: Path, node: SimNode, caplog: pytest.LogCaptureFixture
) -> None:
    _orphan(node)
    _sql(
        config,
        "CREATE TRIGGER no_alerts BEFORE INSERT ON alerts "
        "BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END",
    )
    app = build(load(config), {}, need_store=True)
    try:
        with caplog.at_level(logging.ERROR):
            result = await app.sweep.run(alerting=True, source="test")
    finally:
        await app.close()
    assert [(f.node, f.gpu, f.kind.value) for f in result.findings] == [
        ("node1", 1, "orphaned-vram")
    ]
    assert result.alerted == ()  # nothing claimed as alerted
    (logged,) = [r.getMessage() for r in caplog.records if "sweep alerts" in r.getMessage()]
    assert logged.startswith("sweep alerts not updated: ") and "disk I/O error" in logged
