"""Two replicas (two processes) on one PostgreSQL schema (issue 26): a GPU claimed by two
people at once through both has one winner, and a GPU that comes free is told once: the offer
is made by one, and its DM, due to both, goes out once through the one outbox."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpusim.fleet import SimFleet
from tests.fixtures.db import temp_database
from tests.fixtures.replicas import Replica
from tests.procs import wait_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(tmp_path_factory.mktemp("claim-replicas"), nodes=2, gpus=2) as f:
        yield f


@pytest.fixture
def start(fleet: SimFleet, tmp_path: Path) -> Iterator[Callable[[str], Replica]]:
    started: list[Replica] = []
    with temp_database("postgresql", tmp_path) as url:

        def start_one(name: str) -> Replica:
            argv = [
                sys.executable,
                "-m",
                "tests.integration.claims_replica_main",
                str(fleet.config_path),
                url,
                name,
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
                r.reader.join(timeout=10)
            for pipe in (r.proc.stdin, r.proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()


def answered(r: Replica, n: int) -> Callable[[], bool]:
    return lambda: len(r.of("claimed") + r.of("refused")) >= n


def ticked(a: Replica, b: Replica, n: int) -> Callable[[], bool]:
    return lambda: len(a.of("ticked")) == n == len(b.of("ticked"))


def test_one_winner_and_one_dm_per_free_gpu(start: Callable[[str], Replica]) -> None:
    a, b = start("A"), start("B")
    wait_until(lambda: bool(a.of("ready") and b.of("ready")), 60, "both replicas")
    for round_ in range(3):  # the same GPU, claimed by two people at once through both
        gpu = str(round_ % 2)
        node = f"node{1 + round_ // 2}"
        a.send(f"claim U0A{round_} {node} {gpu}")
        b.send(f"claim U0B{round_} {node} {gpu}")
        for r in (a, b):
            wait_until(answered(r, round_ + 1), 30, f"{r.name}'s answer")
    assert not a.of("error") + b.of("error"), a.of("error") + b.of("error")
    assert len(a.of("claimed") + b.of("claimed")) == 3  # one winner each time
    assert len(a.of("refused") + b.of("refused")) == 3

    a.send("wait U0W node2 1")  # node2 GPU 1 is free: both replicas look twice, then again
    wait_until(lambda: bool(a.of("queued")), 30, "the place in the queue")
    for n in (1, 2, 3):  # by the third look the hold is live, and one replica never told it
        a.send("tick")
        b.send("tick")
        wait_until(ticked(a, b, n), 30, "both ticks")
    dms = a.of("dm") + b.of("dm")
    assert [d["to"] for d in dms] == ["U0W"], json.dumps(dms)
