"""A gpubot-like replica for ``test_replicas.py``: scheduled sweeps and resets on one database.

    python -m tests.integration.replica_main CONFIG DB_URL NAME EXTRA_JSON

It runs the real sweep service under the real scheduler with the real database locks, and
prints one JSON line per event on stdout: ``ready``, ``start``/``done`` around each sweep it
runs, ``skipped``, and for each ``reset NODE GPU`` line read on stdin, ``reset`` or ``refused``.
SIGTERM stops it cleanly; SIGKILL is what the test uses to make it die mid-sweep.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpubot.app import build
from gpubot.config import LeaseSettings, load
from gpubot.core.alerting import SweepResult
from gpubot.core.reset.plan import ResetRequest
from gpubot.errors import GpubotError, LockHeld
from gpubot.scheduler import IntervalScheduler
from gpubot.services.reset import Ask
from gpubot.services.sweep import SweepService
from gpubot.store.leases import DbLeases
from tests.fixtures.settings import sweep_ports, with_tables


def emit(event: str, **data: Any) -> None:
    """Print one event line."""
    print(json.dumps({"event": event, "t": time.time(), "pid": os.getpid(), **data}), flush=True)


class TracedSweeps(SweepService):
    """The real service, telling the test when a sweep it runs starts and ends."""

    async def run(self, **kwargs: Any) -> SweepResult:
        emit("start")
        result = await super().run(**kwargs)
        emit("done", seconds=result.seconds, failed=sorted(result.failed))
        return result

    async def scheduled(self) -> SweepResult:
        result = await super().scheduled()
        if result.skipped:
            emit("skipped", why=result.skipped)
        return result


async def main(config: str, db_url: str, name: str, tables: dict[str, Any]) -> None:
    """Run until SIGTERM."""
    s = load(Path(config))
    ssh = dataclasses.replace(s.ssh, command_timeout_s=4.0, connect_timeout_s=2.0)
    reset = dataclasses.replace(s.reset, grace_s=5.0, verify_timeout_s=6.0, poll_interval_s=0.1)
    leases = LeaseSettings(**tables.pop("leases", {}))  # a dead replica's lease runs out soon
    s = dataclasses.replace(s, database_url=db_url, ssh=ssh, reset=reset, leases=leases)
    s = with_tables(s, tables)
    app = build(s, {}, need_store=True)
    assert app.store is not None
    locks = DbLeases(app.store.engine, replica=name, ttl_s=s.leases.ttl_s, renew_s=s.leases.renew_s)
    ports = sweep_ports(s, app.store, locks=locks)
    svc = TracedSweeps(s, app.status, app.transport, ports, replica=name)
    sched = IntervalScheduler(svc.scheduled, s.sweep.interval_s, first_after_s=0)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    sched.start()
    commands = asyncio.create_task(read_commands(app, name))
    emit("ready", name=name)
    await stop.wait()
    commands.cancel()
    await sched.stop()
    locks.close()
    await app.close()


async def read_commands(app: Any, name: str) -> None:
    """Run ``reset NODE GPU`` lines from stdin (the engine takes the node's reset lock)."""
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str] = asyncio.Queue()

    def reader() -> None:  # a daemon thread: a blocked read never holds up the exit
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line)

    threading.Thread(target=reader, daemon=True).start()
    while True:
        line = await lines.get()
        words = line.split()
        if len(words) == 3 and words[0] == "reset":
            node, gpu = words[1], int(words[2])
            try:  # the reset engine takes the node's database lock itself
                plan, before = await app.reset.plan(ResetRequest(node, None, gpus=(gpu,)))
                result = await app.reset.execute(
                    plan, Ask.by(f"test:{name}", "test", line.strip()), before=before
                )
                emit("reset", node=node, ok=result.ok, action_id=result.action_id)
            except LockHeld as exc:
                emit("refused", node=node, why=str(exc))
            except GpubotError as exc:
                emit("error", why=str(exc))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])))
