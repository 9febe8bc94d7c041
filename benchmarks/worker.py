"""A long-lived client process for the warm methods, driven one round at a time over stdin.

``python -m benchmarks.worker METHOD CONFIG``, METHOD one of:

- ``gpubot``: a running gpubot (``gpubot.app.build``); a round is ``app.status.fleet(["all"])``
  over its pooled connections, rendered to the ``--json`` document;
- ``asyncssh``: the floor, a minimal asyncssh script that holds one open connection per node and
  runs the same two nvidia-smi queries (one exec per node, like every baseline).

The worker connects once (a first, untimed round), prints ``{"ready": ...}`` and then answers
each ``round`` line (or, for gpubot, ``sweep``: one scheduled sweep) with one JSON line: wall
seconds, its own CPU seconds, RSS, open fds, and whether every node answered. ``quit`` closes
the connections and exits.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks.common import open_fds, rss_kib, self_cpu

Round = Callable[[], Awaitable[tuple[bool, str]]]
Closer = Callable[[], Awaitable[None]]


def baseline_command(smi: str) -> str:
    """Return the remote command of every baseline: the two nvidia-smi queries, in sequence."""
    from gpubot.core.probe.nvsmi import apps_query_argv, gpu_query_argv

    return shlex.join(gpu_query_argv(smi)) + "; " + shlex.join(apps_query_argv(smi))


PROBE_SMI_TIMEOUT_S = 18.0  # what gpubot gives each query with its default settings


def remote_command(node: Any, remote: str) -> str:
    """Return a baseline's command for ``node`` (a NodeConfig): the two queries, or with
    ``remote == "probe"`` gpubot's own probe, so a baseline does the same remote work as gpubot
    and a ratio measures gpubot's client side alone."""
    if remote == "probe":
        from gpubot.core.probe.snapshot import probe_argv

        return shlex.join(probe_argv(node, smi_timeout_s=PROBE_SMI_TIMEOUT_S))
    return baseline_command(node.nvidia_smi)


def check_baseline_output(text: str, gpus: int) -> str | None:
    """Return why a baseline's output of one node is incomplete, or None when it is whole."""
    from gpubot.core.probe.nvsmi import GPU_FIELDS

    lines = [ln for ln in text.splitlines() if ln.strip()]
    gpu_lines = [ln for ln in lines if ln.count(",") == len(GPU_FIELDS) - 1 and "GPU-" in ln]
    if len(gpu_lines) != gpus:
        return f"expected {gpus} GPU lines, got {len(gpu_lines)}"
    return None


async def gpubot_method(config: str, experiment: str) -> tuple[dict[str, Round], Closer]:
    """Build a running gpubot; return its rounds (status, sweep) and its close."""
    from gpubot.app import build
    from gpubot.cli.render import fleet_dict
    from gpubot.config import load

    if experiment:
        from benchmarks import experiments

        experiments.apply(experiment)
    settings = load(Path(config))
    app = build(settings, os.environ, need_store=False)
    names = [n.name for n in settings.nodes]
    sweeper = app.sweep  # the composition's: the store's alert state and samples, no notifier

    async def status() -> tuple[bool, str]:
        res = await app.status.fleet(["all"], actor="bench", source="bench")
        doc = fleet_dict(res, names)
        json.dumps(doc)
        ok = res.ok and all(n["ok"] and n["gpus"] for n in doc["nodes"])
        return ok, "" if ok else json.dumps(res.failed)[:300]

    async def sweep() -> tuple[bool, str]:
        # What the scheduler runs: probe, find, record, alert state (no Slack notifier).
        res = await sweeper.run(alerting=True, source="schedule")
        ok = res.ok and len(res.snapshots) == len(names)
        return ok, "" if ok else json.dumps(res.to_dict())[:300]

    return {"round": status, "sweep": sweep}, app.close


async def asyncssh_method(
    config: str, gpus: int, remote: str = ""
) -> tuple[dict[str, Round], Closer]:
    """Open one asyncssh connection per node; return a round of the two queries (or of the probe,
    ``remote == "probe"``) and a close."""
    from gpubot.config import expand, load
    from gpubot.transport.sshlib import asyncssh

    settings = load(Path(config))
    known = expand(settings.ssh.known_hosts)
    conns: list[tuple[Any, str]] = []

    async def connect(node: Any) -> Any:
        return await asyncssh.connect(
            node.host,
            node.port,
            username=node.user,
            known_hosts=known,
            client_keys=[expand(node.key)],
            agent_path=None,
            config=None,
        )

    opened = await asyncio.gather(*(connect(n) for n in settings.nodes))
    conns = [(c, remote_command(n, remote)) for c, n in zip(opened, settings.nodes, strict=True)]

    async def one() -> tuple[bool, str]:
        results = await asyncio.gather(*(c.run(cmd) for c, cmd in conns))
        for r in results:
            why = check_baseline_output(str(r.stdout), gpus)
            if r.exit_status != 0 or why:
                return False, why or f"exit {r.exit_status}: {r.stderr!s:.200}"
        return True, ""

    async def close() -> None:
        for c, _ in conns:
            c.close()
        for c, _ in conns:
            await c.wait_closed()

    return {"round": one}, close


async def serve(method: str, config: str, gpus: int, experiment: str) -> int:
    """Set up ``method``, then answer rounds from stdin until ``quit``."""
    rss_before = rss_kib()
    fds_before = open_fds()
    if method == "gpubot":
        rounds, close = await gpubot_method(config, experiment)
    elif method == "asyncssh":
        rounds, close = await asyncssh_method(config, gpus, experiment)
    else:
        print(json.dumps({"error": f"unknown method {method}"}), flush=True)
        return 2
    rss_built, fds_built = rss_kib(), open_fds()  # gpubot: built, not connected yet
    ok, note = await rounds["round"]()  # connect: the warm rounds reuse these connections
    ready = {
        "ready": ok,
        "note": note,
        "rss_kib_bare": rss_before,
        "fds_bare": fds_before,
        "rss_kib_built": rss_built,
        "fds_built": fds_built,
        "rss_kib": rss_kib(),
        "fds": open_fds(),
    }
    print(json.dumps(ready), flush=True)
    loop = asyncio.get_running_loop()
    try:
        while True:
            line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
            if line in ("", "quit") or line not in rounds:
                return 0
            cpu0, t0 = self_cpu(), time.monotonic()
            ok, note = await rounds[line]()
            wall, cpu = time.monotonic() - t0, self_cpu() - cpu0
            print(
                json.dumps(
                    {
                        "wall": wall,
                        "cpu": cpu,
                        "ok": ok,
                        "note": note,
                        "rss_kib": rss_kib(),
                        "fds": open_fds(),
                    }
                ),
                flush=True,
            )
    finally:
        await close()


def main(argv: list[str]) -> int:
    """Run the worker: ``METHOD CONFIG GPUS [EXPERIMENT]``."""
    method, config, gpus = argv[0], argv[1], int(argv[2])
    experiment = argv[3] if len(argv) > 3 else ""
    return asyncio.run(serve(method, config, gpus, experiment))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
