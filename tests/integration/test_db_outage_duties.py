"""A PostgreSQL outage under ``gpubot serve``: one line when it starts and one when it ends, per
replica, however many turns of how many duties fail in between (issue 34).

Two ``gpubot serve`` processes (two replicas) run on one PostgreSQL of the test's own
(``tests.fixtures.own_pg``) with short duty intervals: sweeps every second (under the sweep
lease: one replica sweeps at a time), the claims' duty and the approvals' expiry every 0.3 s.
The database is stopped for ``DOWN_S`` seconds and started again; the test counts each replica's
log lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.own_pg import OwnPostgres, own_postgres
from tests.fixtures.slack import (
    BOT_TOKEN,
    SECRET,
    SLACK_EXTRA,
    FakeSlack,
    users_table,
    workload_owner,
)

REPO = Path(__file__).resolve().parents[2]
DOWN_S = 8.0  # the outage: many ticks of each duty at these intervals


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return '"' + str(v) + '"'


def _config(fleet: Any, folder: Path, db_url: str) -> Path:
    """The fleet's settings on ``db_url`` with the Slack tables and short duty intervals."""
    text = fleet.config_path.read_text()
    start = text.index('url = "', text.index("[database]"))
    text = text[:start] + f'url = "{db_url}"' + text[text.index("\n", start) :]
    extra = {
        **SLACK_EXTRA,
        "users": users_table(workload_owner(fleet)),
        "sweep": {"interval_s": 1.0, "budget_s": 1.0},
        "claims": {"every_s": 0.3},
    }
    for table, values in extra.items():
        text += f"\n[{table}]\n" + "".join(f'"{k}" = {_toml(v)}\n' for k, v in values.items())
    path = folder / "gpubot.toml"
    path.write_text(text)
    return path


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# The control: gpubot serve with the outage's filter taken off (``SaidOnce`` lets every record
# through), so each duty logs its own line for each turn, as before issue 34.
UNFILTERED = (
    "import sys; from gpubot.store import outage; "
    "outage.SaidOnce.filter = lambda self, record: True; "
    "from gpubot.cli import main; sys.argv[0] = 'gpubot'; raise SystemExit(main())"
)


async def _serve(config: Path, fake: FakeSlack, *, control: bool = False) -> Replica:
    """Start one replica (``control``: without the fix) on its own port."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "GPUBOT_"))}
    env |= {
        "SLACK_BOT_TOKEN": BOT_TOKEN,
        "SLACK_SIGNING_SECRET": SECRET,
        "SLACK_API_URL": fake.base_url,
    }
    argv = ["--config", str(config), "serve", "--http", "--port", str(_port())]
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, *(("-c", UNFILTERED) if control else ("-m", "gpubot"))),
        *(*argv, "--expire-every", "0.3"),
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    return Replica(proc)


class Replica:
    """One ``gpubot serve`` and the lines of its log so far."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        async for raw in self.proc.stderr:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    async def until(self, text: str, within_s: float = 60.0) -> None:
        async with asyncio.timeout(within_s):
            while not any(text in ln for ln in self.lines):
                await asyncio.sleep(0.1)

    async def stop(self) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)  # the process this test started, by pid
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        await self.reader
        return self.proc.returncode or 0


@pytest.fixture
async def pg() -> AsyncIterator[OwnPostgres]:
    with own_postgres() as server:
        yield server


UNREACHABLE = re.compile(r" ERROR gpubot\.store\.outage: audit database unreachable since 20")
BACK = re.compile(r" WARNING gpubot\.store\.outage: audit database reachable again after \d+ s")
WARNING = re.compile(r" (WARNING|ERROR|CRITICAL) ")
CONNECTION = re.compile(
    r"connection (refused|failed|to server)|closed the connection|terminating connection"
    r"|the database system is (shutting down|starting up)",
    re.I,
)


async def _outage(replicas: list[Replica], pg: OwnPostgres) -> list[list[str]]:
    """Stop the database for ``DOWN_S`` seconds under the running replicas, start it again;
    return each one's log lines from just before the stop to its end."""
    try:
        for r in replicas:
            await r.until("serving Slack at")
        await asyncio.sleep(2.0)  # every duty has run against the database that is up
        marks = [len(r.lines) for r in replicas]
        await asyncio.to_thread(pg.stop)
        await asyncio.sleep(DOWN_S)
        await asyncio.to_thread(pg.start)
        for r in replicas:  # each has said it is back (or the assertions below say otherwise)
            with contextlib.suppress(TimeoutError):
                await r.until("reachable again", within_s=30.0)
        await asyncio.sleep(2.0)
    finally:
        codes = [await r.stop() for r in replicas]
    assert codes == [0] * len(replicas), codes
    return [r.lines[mark:] for r, mark in zip(replicas, marks, strict=True)]


async def test_an_outage_is_two_lines_per_replica_and_the_duties_lines_without_the_fix(
    slack_fleet: Any, fake_slack: FakeSlack, pg: OwnPostgres, tmp_path: Path
) -> None:
    """Two replicas with the fix and one without (the control) live through the same outage."""
    config = _config(slack_fleet, tmp_path, pg.database())
    replicas = [await _serve(config, fake_slack, control=n == 2) for n in range(3)]
    *fixed, control = await _outage(replicas, pg)
    for log in fixed:
        text = "\n".join(log)
        warnings = [ln for ln in log if WARNING.search(ln)]
        assert [ln for ln in warnings if UNREACHABLE.search(ln)] == warnings[:1], text
        assert CONNECTION.search(warnings[0]), warnings[0]
        assert [ln for ln in warnings if BACK.search(ln)] == warnings[1:], text
        assert len(warnings) == 2, text  # nothing else: not a duty's line, not a traceback
        assert "Traceback" not in text
    # The control: the duties ran and failed, turn after turn, each saying so in its own line.
    said = [ln for ln in control if WARNING.search(ln) and CONNECTION.search(ln)]
    duties = {ln.split(": ", 2)[1] for ln in said if "gpubot.store.outage" not in ln}
    text = "\n".join(control)
    assert len(said) > 10, text
    assert {"claims duty skipped", "approvals not expired"} <= duties, duties
