"""A CLI reset cut off after SIGTERM (the node's SSH server goes away in the grace wait) says what
was sent: the error line names the pid, the signal and its time; ``--json`` gives the targeted
GPU ``unknown`` and lists the signal; the audit outcome holds the same."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from gpubot.config import load
from gpubot.store import open_store
from gpusim.fleet import SimFleet, SimNode
from tests.fixtures.fleet import leave_clean
from tests.procs import alive


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(tmp_path_factory.mktemp("reset-cut"), nodes=1, gpus=2) as f:
        yield f


@pytest.fixture
def node(fleet: SimFleet) -> Iterator[SimNode]:
    n = fleet.node("node1")
    yield n
    n.start_server()
    leave_clean(n)


def _sigterm_recorded(url: str) -> bool:
    store = open_store(url)
    try:

        async def look() -> bool:
            for a in await store.incomplete_actions():
                d = await store.action(a.id)
                if d is not None and any(e.data.get("kind") == "signal" for e in d.events):
                    return True
            return False

        return asyncio.run(look())
    finally:
        store.close()


def test_a_reset_cut_off_after_sigterm_lists_what_was_sent(fleet: SimFleet, node: SimNode) -> None:
    url = load(fleet.config_path).database_url
    open_store(url).close()  # the new SQLite file sets itself up before the reset runs
    w = node.spawn(gpu=0, mib=2048, behaviour="stubborn")
    env = {k: v for k, v in os.environ.items() if k != "GPUBOT_CONFIG"}
    argv = [
        sys.executable,
        "-m",
        "gpubot",
        "--config",
        str(fleet.config_path),
        "reset",
        "node1",
        "--gpu",
        "0",
        "--yes",
        "--json",
        "--grace",
        "20",
    ]
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as proc:
        deadline = time.monotonic() + 60
        while not _sigterm_recorded(url):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "SIGTERM never recorded"
            time.sleep(0.2)
        node.stop_server()  # the connection is cut in the grace wait
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    lines = [ln for ln in err.splitlines() if ln.startswith("gpubot: error: ")]
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("gpubot: error: node1: ")  # what cut it, first
    assert f"already sent on node1: SIGTERM to pid {w.pid} at " in line
    assert "GPU 0: unknown" in line and "Traceback" not in err
    doc = json.loads(out)
    assert [(g["index"], g["outcome"]) for g in doc["gpus"]] == [(0, "unknown")]
    assert [(s["pid"], s["signal"]) for s in doc["sent"]] == [(w.pid, "SIGTERM")]
    assert doc["sent"][0]["after"].startswith(("still alive at ", "not known since"))
    assert alive(w.pid)  # stubborn: SIGTERM alone did not end it, and no SIGKILL went out

    store = open_store(url)
    try:
        (action,) = asyncio.run(store.actions(node="node1"))
        detail = asyncio.run(store.action(action.id))
    finally:
        store.close()
    assert action.status == "error" and detail is not None and detail.result is not None
    assert [g["outcome"] for g in detail.result["gpus"]] == ["unknown"]
    assert detail.result["sent"] == doc["sent"]
