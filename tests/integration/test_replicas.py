"""Two replicas (two processes) on one PostgreSQL schema: one sweep at a time and one per
interval, one reset per node, and takeover after the sweeping one is killed (SIGKILL by PID)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpubot.store import open_store
from gpusim.fleet import SimFleet
from tests.fixtures.db import temp_database
from tests.fixtures.replicas import Replica
from tests.procs import remote_probes, wait_until

ROOT = Path(__file__).resolve().parents[2]
INTERVAL = 1.5
TTL_S = 1.5  # a killed replica's sweep lease is taken over this long after its last renewal
EXTRA = {
    "sweep": {"interval_s": INTERVAL, "budget_s": INTERVAL},
    "leases": {"ttl_s": TTL_S, "renew_s": 0.25},
}


@pytest.fixture
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(tmp_path_factory.mktemp("replicas"), nodes=3, gpus=1) as f:
        yield f


@pytest.fixture
def pg_url(tmp_path: Path) -> Iterator[str]:
    with temp_database("postgresql", tmp_path) as url:
        yield url


@pytest.fixture
def start(fleet: SimFleet, pg_url: str) -> Iterator[Callable[[str], Replica]]:
    started: list[Replica] = []

    def start_one(name: str) -> Replica:
        argv = [
            sys.executable,
            "-m",
            "tests.integration.replica_main",
            str(fleet.config_path),
            pg_url,
            name,
            json.dumps(EXTRA),
        ]
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        r = Replica(name, proc)
        r.reader = threading.Thread(target=r.read, daemon=True)
        r.reader.start()
        started.append(r)
        return r

    yield start_one
    for r in started:  # exactly the processes this test started, by pid
        if r.proc.poll() is None:
            r.proc.send_signal(signal.SIGTERM)
            try:
                r.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait()
        if r.reader is not None:
            r.reader.join(timeout=10)  # it reads to the end of a dead process's output
        for pipe in (r.proc.stdin, r.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
    # A killed replica's probe still runs on the (simulated) node: let it end before the fleet
    # stops, as its SSH server cannot close a session whose command still runs.
    for n in fleet.nodes:
        n.set_fault(None)
    wait_until(lambda: not remote_probes(fleet), 10, "remote probes to end")


def spans(replicas: list[Replica]) -> list[tuple[float, float, str]]:
    """Return (start, end, replica) of every finished sweep, in time order."""
    out = []
    for r in replicas:
        starts, dones = r.of("start"), r.of("done")
        out += [(s["t"], d["t"], r.name) for s, d in zip(starts, dones, strict=False)]
    return sorted(out)


def test_two_replicas_share_sweeps_and_resets(
    fleet: SimFleet, pg_url: str, start: Callable[[str], Replica]
) -> None:
    fleet.node("node3").set_fault("slow", delay_s=0.8)  # every sweep lasts most of a second
    a, b = start("A"), start("B")
    wait_until(lambda: bool(a.of("ready") and b.of("ready")), 30, "both replicas")

    # One sweep at a time, one an interval, whichever replica gets there first.
    wait_until(lambda: len(spans([a, b])) >= 3, 30, "three sweeps")
    done = spans([a, b])
    for (s1, e1, _), (s2, _, _) in itertools.pairwise(done):
        assert s2 >= e1, f"overlapping sweeps: {done}"
        assert s2 - s1 >= 0.85 * INTERVAL, f"two sweeps in one interval: {done}"
    assert a.of("skipped") or b.of("skipped")  # the other one stood aside

    # One reset per node: both replicas are asked at once; the workload takes 2 s to exit.
    w = fleet.node("node1").spawn(gpu=0, mib=4096, behaviour="slow", slow_exit_s=2.0)
    a.send("reset node1 0")
    b.send("reset node1 0")
    wait_until(
        lambda: len(a.of("reset") + a.of("refused") + b.of("reset") + b.of("refused")) == 2,
        30,
        "both reset attempts",
    )
    (won,) = a.of("reset") + b.of("reset")
    (lost,) = a.of("refused") + b.of("refused")
    assert won["ok"] is True and won["name"] != lost["name"]
    assert lost["why"].startswith("reset:node1 is busy: held by ")
    assert f"test:{won['name']} since " in lost["why"]
    assert not w.alive()

    # Takeover: kill the replica that is sweeping right now; the other sweeps next interval.
    seen = len(a.of("start")) + len(b.of("start"))
    wait_until(lambda: len(a.of("start")) + len(b.of("start")) > seen, 10, "the next sweep")
    sweeping = max((a, b), key=lambda r: r.of("start")[-1]["t"] if r.of("start") else 0.0)
    other = b if sweeping is a else a
    killed_at = time.time()
    os.kill(sweeping.proc.pid, signal.SIGKILL)
    sweeping.proc.wait(timeout=10)
    assert len(sweeping.of("done")) < len(sweeping.of("start"))  # it died mid-sweep
    wait_until(
        lambda: any(e["t"] > killed_at for e in other.of("done")),
        3 * INTERVAL + TTL_S + 5,
        "the survivor's sweep",
    )
    took_over = min(e["t"] for e in other.of("start") if e["t"] > killed_at)
    assert took_over - killed_at < 2 * INTERVAL + TTL_S + 1  # its lease ran out first

    # The audit log holds exactly the sweeps that finished, and one reset of node1.
    store = open_store(pg_url)
    try:
        import asyncio

        records = asyncio.run(store.queries(limit=1000))
        actions = asyncio.run(store.actions(node="node1"))
        notes = [r for r in asyncio.run(store.records(limit=100_000)) if r.kind == "lease"]
    finally:
        store.close()
    # The takeover of the killed replica's expired sweep lease is in the audit log.
    took = [n.data["took_over"]["holder"] for n in notes if n.data["lease"] == "sweep"]
    assert f"{sweeping.name} sweep" in took, [n.data for n in notes]
    recorded = sorted(r.actor for r in records if r.data["query"] == "sweep")
    finished = sorted(f"gpubot:{r.name}" for r in (a, b) for _ in r.of("done"))
    assert recorded == finished
    assert [(x.kind, x.actor, x.status) for x in actions] == [
        ("reset", f"test:{won['name']}", "freed")
    ]
