"""Reset planning: who is a target, who is left alone, and why."""

from __future__ import annotations

import pytest

from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.plan import ResetPlan, ResetRequest, plan_reset
from gpubot.errors import UsageError

PROTECTED = ("nvidia-persistenced", "Xorg")


def gpu(i: int, used: int | None = 0) -> GpuInfo:
    return GpuInfo(i, f"GPU-{i:08d}", "NVIDIA H200", used, 143771, 0)


def proc(
    pid: int, g: int, user: str = "alice", mib: int | None = 1000, *, visible: bool = True,
    name: str = "/usr/bin/python3", ticks: int | None = 100,
) -> GpuProcess:  # fmt: skip
    return GpuProcess(pid, g, mib if visible else None, name, visible, True, user,
                      ppid=1, state="S", start_ticks=ticks, command=f"{name} train.py")  # fmt: skip


SNAP = NodeSnapshot(
    "node1",
    0.0,
    (gpu(0, 1000), gpu(1, 3000), gpu(2, 500), gpu(3, 0)),
    (
        proc(10, 0),
        proc(11, 1, "bob", 2000),
        proc(12, 1, mib=1000),
        proc(13, 1, "carol", visible=False),  # hidden: device file only
        proc(14, 2, "root", 500, name="/usr/bin/nvidia-persistenced"),
        proc(15, 1, "alice", 500),  # also on GPU 2 below
        proc(15, 2, "alice", 0),
        proc(16, 3, "dave", 100, ticks=None),  # listed but gone from /proc
    ),
)


def plan(**kw: object) -> ResetPlan:
    req = ResetRequest("node1", kw.pop("requester", "alice"), **kw)  # type: ignore[arg-type]
    return plan_reset(SNAP, req, PROTECTED)


@pytest.mark.parametrize(
    ("kw", "targets", "forced"),
    [
        ({"gpus": (0,)}, [10], False),
        ({"gpus": (1,)}, [11, 12, 13, 15], True),
        ({"gpus": (1,), "user": "alice"}, [12, 15], False),
        ({"pids": (12,)}, [12], False),
        ({"gpus": (2,)}, [15], False),  # the protected daemon is left alone
        ({"gpus": (3,)}, [], False),  # nothing to signal: the listed pid is gone
        ({}, [10, 11, 12, 13, 15], True),
        ({"gpus": (0,), "requester": None}, [10], True),
    ],
)
def test_targets(kw: dict[str, object], targets: list[int], forced: bool) -> None:
    p = plan(**kw)
    assert sorted(t.pid for t in p.targets) == targets
    assert p.forced is forced


def test_hidden_holder_is_a_target_with_its_reason() -> None:
    t = next(t for t in plan(gpus=(1,)).targets if t.pid == 13)
    assert t.mib is None and any("nvidia-smi does not list" in r for r in t.reasons)


def test_target_on_another_gpu_is_flagged() -> None:
    t = next(t for t in plan(gpus=(1,)).targets if t.pid == 15)
    assert t.also_on == (2,) and any("also holds GPU 2" in r for r in t.reasons)


def test_left_alone_processes_set_the_expected_memory() -> None:
    p = plan(gpus=(1, 2), user="alice")
    assert p.expected_after_mib == {1: 2000, 2: 500}
    reasons = {(s.pid, s.reason) for s in p.skipped}
    assert (11, "not owned by alice") in reasons and (14, "protected process") in reasons


def test_plan_round_trips_through_dict() -> None:
    p = plan(gpus=(1,))
    assert ResetPlan.from_dict(p.to_dict()) == p


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"gpus": (9,)}, "node1 has no GPU 9 (GPUs: 0, 1, 2, 3)"),
        ({"pids": (999,)}, "pid 999 holds no GPU on node1"),
        ({"gpus": (0,), "pids": (12,)}, "pid 12 is not on GPU 0"),
    ],
)
def test_bad_requests(kw: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan(**kw)
