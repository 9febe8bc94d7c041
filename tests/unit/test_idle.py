"""core/idle: idle runs from sweep samples, idle holders, GPU-hours held idle."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpubot.config import parse
from gpubot.core.findings import SweepConfig, find
from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.usage.idle import (
    GpuSample,
    IdleRule,
    gpu_hours_by_owner,
    held_idle_since,
    idle_gpus,
    samples_of,
)
from gpubot.core.workload import Workload
from gpubot.errors import ConfigError

H = 3600.0
NOW = 1_750_000_000.0
RULE = IdleRule(min_mib=4096, hours=4.0)
GAP = 450.0  # 1.5 sweeps of 5 minutes


def test_the_issues_sweeps_table_is_our_sweep_table() -> None:
    """The issue writes ``[sweeps]``; there is one table, ``[sweep]``, and a typo says so."""
    with pytest.raises(ConfigError, match=r"^<settings>: sweeps: unknown key$"):
        parse({"sweeps": {"idle_hours": 4}})


# --- idle runs -----------------------------------------------------------------------------------


def s(
    ago_h: float,
    util: int | None = 0,
    mem: int | None = 8192,
    *,
    gpu: int = 0,
    uuid: str = "GPU-0",
    node: str = "n1",
) -> GpuSample:
    """A sample of n1 GPU 0 taken ``ago_h`` hours before NOW."""
    return GpuSample(node, gpu, uuid, NOW - ago_h * H, util, mem)


def every(hours: float, step_h: float = 5 / 60, **kw: object) -> list[GpuSample]:
    """A zero-utilisation sample every 5 minutes from ``hours`` ago up to (not including) now."""
    n = round(hours / step_h)
    return [s(hours - i * step_h, **kw) for i in range(n)]  # type: ignore[arg-type]


RUNS = [
    ("no history: idle since now", [], s(0), NOW),
    ("0 % for 5 h", every(5), s(0), NOW - 5 * H),
    ("busy now: not idle", every(5), s(0, util=1), None),
    ("unknown now: not idle", every(5), s(0, util=None), None),
    ("memory unknown now: not idle", every(5), s(0, mem=None), None),
    ("too little memory now: not idle", every(5), s(0, mem=4095), None),
    (
        "one busy sample ends the run",
        [*every(5)[:12], s(3.9, util=7), *every(3.5)],
        s(0),
        NOW - 3.5 * H,
    ),
    (
        "one unknown sample ends the run",
        [*every(5)[:12], s(3.9, util=None), *every(3.5)],
        s(0),
        NOW - 3.5 * H,
    ),
    (
        "memory below the minimum ends the run",
        [*every(5)[:12], s(3.9, mem=100), *every(3.5)],
        s(0),
        NOW - 3.5 * H,
    ),
    (
        "a missed sweep (gap > 1.5 intervals) ends the run",
        [*every(5)[:12], *every(3.5)],
        s(0),
        NOW - 3.5 * H,
    ),
    ("another GPU's samples do not count", every(5, gpu=1), s(0), NOW),
    ("the same index with another uuid is another GPU", every(5, uuid="GPU-x"), s(0), NOW),
    ("another node's samples do not count", every(5, node="n2"), s(0), NOW),
    ("samples after now (another clock) do not count", [s(-1), s(-2)], s(0), NOW),
]


@pytest.mark.parametrize(("what", "history", "current", "since"), RUNS, ids=[r[0] for r in RUNS])
def test_held_idle_since(
    what: str, history: list[GpuSample], current: GpuSample, since: float | None
) -> None:
    got = held_idle_since(history, current, min_mib=4096, max_gap_s=GAP)
    assert got == (None if since is None else pytest.approx(since))


def test_history_order_does_not_matter() -> None:
    history = every(5)
    assert held_idle_since(history[::-1], s(0), min_mib=4096, max_gap_s=GAP) == pytest.approx(
        NOW - 5 * H
    )


WINDOWS = [
    ("idle for 5 h of a 4 h window", every(5), {("n1", 0): 5 * H}),
    ("idle for exactly the window", every(4), {("n1", 0): 4 * H}),
    ("idle for 3 h 55 min: not yet", every(4)[1:], {}),
    ("busy 3 h ago: not idle", [*every(5)[:24], s(3, util=40), *every(2.9)], {}),
]


@pytest.mark.parametrize(("what", "history", "want"), WINDOWS, ids=[w[0] for w in WINDOWS])
def test_idle_gpus(what: str, history: list[GpuSample], want: dict[object, float]) -> None:
    got = idle_gpus([s(0), s(0, util=90, gpu=1, uuid="GPU-1")], history, RULE, max_gap_s=GAP)
    assert got == pytest.approx(want)


def test_idle_hours_zero_turns_it_off() -> None:
    assert idle_gpus([s(0)], every(30), replace(RULE, hours=0), max_gap_s=GAP) == {}


def test_samples_of_a_snapshot_keep_unknowns_unknown() -> None:
    snap = NodeSnapshot(
        "n1",
        0.0,
        (
            GpuInfo(1, "GPU-b", "H200", None, 143771, None),
            GpuInfo(0, "GPU-a", "H200", 9000, 143771, 0),
        ),
    )
    assert samples_of([snap], NOW) == [
        GpuSample("n1", 0, "GPU-a", NOW, 0, 9000),
        GpuSample("n1", 1, "GPU-b", NOW, None, None),
    ]


# --- idle holders --------------------------------------------------------------------------------

CFG = SweepConfig(idle=RULE)
JOB = Workload("docker", "ab" * 32, name="train-llama", owner="bob").with_detail(
    image="pytorch:2.4"
)


def proc(
    pid: int,
    mem: int | None,
    *,
    gpu: int = 0,
    user: str = "alice",
    state: str = "S",
    ticks: int | None = 1000,
    workload: Workload | None = None,
    age: int | None = 10 * 3600,
) -> GpuProcess:
    return GpuProcess(
        pid,
        gpu,
        mem,
        "python3",
        True,
        True,
        user=user,
        state=state,
        start_ticks=ticks,
        uid=1000,
        real_uid=1000,
        exe="/usr/bin/python3",
        workload=workload,
        elapsed_s=age,
    )


def gpu(index: int, used: int) -> GpuInfo:
    return GpuInfo(index, f"GPU-{index}", "H200", used, 143771, 0, minor=index)


def test_idle_holders_from_the_idle_gpus() -> None:
    snap = NodeSnapshot(
        "n1",
        NOW,
        (gpu(0, 12288), gpu(1, 8192), gpu(2, 8192)),
        (
            proc(10, 8192),
            proc(11, 4096),
            proc(12, 1000),  # GPU 0: two holders, one too small
            proc(13, 8192, gpu=1, workload=JOB),  # GPU 1: bob's container, run by root's dockerd
            proc(14, 8192, gpu=2),  # GPU 2: not idle long enough (not in the map)
        ),
    )
    idle = {("n1", 0): 5 * H, ("n1", 1): 4.5 * H}
    found = find([snap], {}, CFG, idle=idle)
    assert [(f.gpu, f.kind.value, f.holder, f.owner) for f in found] == [
        (0, "idle-holder", "10:1000", "alice"),
        (0, "idle-holder", "11:1000", "alice"),
        (1, "idle-holder", "13:1000", "bob"),
    ]
    by_pid = {f.pid: f for f in found}
    assert by_pid[10].summary == (
        "pid 10 python3 (alice) holds 8192 MiB of GPU 0, idle (0 %) for 5 h"
    )
    assert by_pid[13].summary == (
        "pid 13 python3 (alice) holds 8192 MiB of GPU 1, idle (0 %) for 4 h 30 min: container "
        "`train-llama` (image `pytorch:2.4`) of Linux user `bob`"
    )
    assert by_pid[13].workload == "docker:train-llama"
    assert by_pid[13].to_dict()["idle_hours"] == 4.5
    held = [(f.owner, f.node, f.gpu, f.idle_s or 0.0) for f in found if f.gpu is not None]
    assert gpu_hours_by_owner(held) == {
        "alice": 5.0,
        "bob": 4.5,
    }  # alice's two processes share one GPU: counted once


def test_a_cgroup_that_names_nothing_is_no_workload_label() -> None:
    other = Workload("other", "/my.slice/looks-like-docker")
    snap = NodeSnapshot("n1", NOW, (gpu(0, 8192),), (proc(30, 8192, workload=other),))
    (f,) = find([snap], {}, CFG, idle={("n1", 0): 4 * H})
    assert (f.workload, f.owner) == (None, "alice") and f.summary.endswith("for 4 h")


def test_a_run_of_exactly_the_window_read_back_from_the_store_counts() -> None:
    """Stored times keep microseconds: a run of exactly the window may come back a hair short."""
    start = 1_796_040_000.123456789
    history = [GpuSample("n1", 0, "GPU-0", start + 0.0000004, 0, 8192)]
    now = GpuSample("n1", 0, "GPU-0", start + 4 * H, 0, 8192)
    assert idle_gpus([now], history, RULE, max_gap_s=5 * H) == {("n1", 0): 4 * H}


def test_what_is_worse_than_idle_stays_what_it_is() -> None:
    snap = NodeSnapshot(
        "n1", NOW, (gpu(0, 16384),), (proc(20, 8192, state="Z"), proc(21, 8192, ticks=None))
    )
    found = find([snap], {}, CFG, idle={("n1", 0): 9 * H})
    assert {(f.holder, f.kind.value) for f in found} == {
        ("20:1000", "zombie-process"),
        ("21:gone", "zombie-process"),
    }


def test_gpu_hours_by_owner() -> None:
    rows = [
        ("alice", "n1", 0, 2 * H),
        ("alice", "n1", 0, 2 * H),
        ("alice", "n2", 3, 6 * H),
        ("bob", "n1", 0, 2 * H),
        (None, "n1", 1, 9 * H),
        ("carol", "n1", 2, 9 * H),
    ]
    assert list(gpu_hours_by_owner(rows).items()) == [("carol", 9.0), ("alice", 8.0), ("bob", 2.0)]
    assert gpu_hours_by_owner([]) == {}
