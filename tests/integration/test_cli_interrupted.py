"""A CLI reset SIGKILLed in its grace wait is named by every CLI command that touches the node,
until someone marks it reviewed (an audit record of its own).

Real processes throughout: the simulated fleet over SSH, a stubborn workload that ignores
SIGTERM, ``gpubot reset`` as a real process killed by its PID, then the real CLI again.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpubot.config import load
from gpubot.store import open_store
from gpusim.fleet import SimFleet
from tests.fixtures.fleet import gpubot_cli, leave_clean
from tests.procs import alive


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(tmp_path_factory.mktemp("interrupted"), nodes=2, gpus=4) as f:
        done = gpubot_cli(f.config_path, "db", "upgrade")
        assert done.returncode == 0, done.stderr
        yield f


def _killed_in_grace_wait(fleet: SimFleet, pid_to_spare: int) -> int:
    """Start ``gpubot reset node1 --gpu 0`` (a 60 s grace), SIGKILL it, by its PID, once its
    SIGTERM went out; return the action id its intent got."""
    env = {k: v for k, v in os.environ.items() if k != "GPUBOT_CONFIG"}
    argv = [sys.executable, "-m", "gpubot", "--config", str(fleet.config_path)]
    argv += ["reset", "node1", "--gpu", "0", "--grace", "60", "--yes"]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env)
    seen = b""
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        while b"signal=SIGTERM" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stderr], [], [], 1.0)
            if ready:
                chunk = os.read(proc.stderr.fileno(), 4096)
                assert chunk, f"gpubot reset ended early: {seen.decode()}"
                seen += chunk
        assert b"signal=SIGTERM" in seen, seen.decode()
        assert alive(pid_to_spare)  # stubborn: in the grace wait, not yet SIGKILLed
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # the CLI this test started
        proc.wait(timeout=30)
        if proc.stderr is not None:
            proc.stderr.close()
    return _only_incomplete(fleet.config_path)


def _only_incomplete(config: Path) -> int:
    store = open_store(load(config).database_url)
    try:
        (left,) = asyncio.run(store.incomplete_actions())
        return left.id
    finally:
        store.close()


def _review_records(config: Path, action_id: int) -> list[dict[str, object]]:
    async def read() -> list[dict[str, object]]:
        return [
            {"actor": r.actor, "source": r.source, **r.data}
            for r in await store.records()
            if r.kind == "review" and r.action_id == action_id
        ]

    store = open_store(load(config).database_url)
    try:
        return asyncio.run(read())
    finally:
        store.close()


def test_a_sigkilled_cli_reset_is_named_until_reviewed(fleet: SimFleet) -> None:
    config, node = fleet.config_path, fleet.node("node1")
    before = gpubot_cli(config, "status", "node1")
    assert "never finished" not in before.stdout + before.stderr  # control: nothing to name
    w = node.spawn(gpu=0, mib=1024, behaviour="stubborn")
    try:
        action = _killed_in_grace_wait(fleet, w.pid)
        line = f"reset #{action} on node1 by cli:"
        tail = f"never finished: `gpubot audit show {action}`"

        text = gpubot_cli(config, "status", "node1")
        assert text.returncode == 0, text.stderr
        (named,) = [ln for ln in text.stdout.splitlines() if ln.startswith(line)]
        assert named.endswith(tail) and " UTC " in named
        assert f"gpubot audit review {action}" in text.stdout
        doc = json.loads(gpubot_cli(config, "status", "node1", "--json").stdout)  # still JSON
        (item,) = doc["interrupted"]
        assert item["id"] == action and item["node"] == "node1" and item["kind"] == "reset"
        assert item["review"] == f"gpubot audit review {action}"
        other = json.loads(gpubot_cli(config, "status", "node2", "--json").stdout)
        assert other["interrupted"] == []  # another node's commands do not name it

        dry = gpubot_cli(config, "reset", "node1", "--gpu", "0", "--dry-run")
        assert any(ln.startswith(line) for ln in dry.stderr.splitlines()), dry.stderr
        dry_doc = json.loads(gpubot_cli(config, "reset", "node1", "--dry-run", "--json").stdout)
        assert [i["id"] for i in dry_doc["interrupted"]] == [action]
        gpu_reset = gpubot_cli(config, "gpu-reset", "node1", "--gpu", "0")  # no TTY: asks no one
        assert gpu_reset.returncode == 2 and "add --yes" in gpu_reset.stderr
        assert any(ln.startswith(line) for ln in gpu_reset.stderr.splitlines()), gpu_reset.stderr
        sweep = gpubot_cli(config, "sweep")
        assert any(ln.startswith(line) for ln in sweep.stdout.splitlines()), sweep.stdout
        sweep_doc = json.loads(gpubot_cli(config, "sweep", "--json").stdout)
        assert [i["id"] for i in sweep_doc["interrupted"]] == [action]

        listed = gpubot_cli(config, "audit", "list", "--incomplete", "--json")
        assert [a["id"] for a in json.loads(listed.stdout)] == [action]
        assert json.loads(listed.stdout)[0]["status"] == "incomplete"

        review = gpubot_cli(config, "audit", "review", str(action), "--note", "checked node1")
        assert review.returncode == 0, review.stderr
        assert f"action {action} marked reviewed by cli:" in review.stdout
        (rec,) = _review_records(config, action)  # the review is an audit record
        assert rec["source"] == "cli" and rec["note"] == "checked node1"
        assert str(rec["actor"]).startswith("cli:")

        after = gpubot_cli(config, "status", "node1")
        assert "never finished" not in after.stdout + after.stderr
        after_doc = json.loads(gpubot_cli(config, "status", "node1", "--json").stdout)
        assert after_doc["interrupted"] == []
        empty = gpubot_cli(config, "audit", "list", "--incomplete")
        assert empty.stdout.strip() == "no actions match"
        shown = gpubot_cli(config, "audit", "show", str(action))
        assert "reviewed: by cli:" in shown.stdout and "checked node1" in shown.stdout
        again = gpubot_cli(config, "audit", "review", str(action))
        assert again.returncode == 2 and "Traceback" not in again.stderr
        assert f"action {action} was marked reviewed already" in again.stderr
        assert len(_review_records(config, action)) == 1
    finally:
        leave_clean(node)


def test_a_finished_action_cannot_be_reviewed(fleet: SimFleet) -> None:
    node = fleet.node("node2")
    w = node.spawn(gpu=1, mib=512)
    try:
        done = gpubot_cli(fleet.config_path, "reset", "node2", "--gpu", "1", "--yes", "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["interrupted"] == []
        listed = gpubot_cli(fleet.config_path, "audit", "list", "--node", "node2", "--json")
        action = json.loads(listed.stdout)[0]["id"]
        p = gpubot_cli(fleet.config_path, "audit", "review", str(action))
        assert p.returncode == 2 and "Traceback" not in p.stderr
        assert f"action {action} finished (" in p.stderr and "nothing to review" in p.stderr
        assert not alive(w.pid)
    finally:
        leave_clean(node)
