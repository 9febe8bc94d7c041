"""Reset planning: who is a target, who is left alone, and why."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.reset.plan import ResetPlan, ResetRequest, plan_reset
from gpubot.core.reset.protect import Protection
from gpubot.core.workload import Workload, decide_owner
from gpubot.errors import ResetRefused, UsageError

PERSISTENCED = "/usr/bin/nvidia-persistenced"
PROTECTION = Protection(
    paths=(PERSISTENCED, "/usr/lib/xorg/Xorg"), system_users=("root", "nvidia-persistenced")
)
UIDS = {
    "root": 0,
    "nvidia-persistenced": 990,
    "alice": 1000,
    "bob": 1001,
    "carol": 1002,
    "dave": 1003,
}
AUTO = -1  # the uid of ``user``


MINORS = {0: 3, 1: 0, 2: 4, 3: 1, 4: 2}  # an index is not its device file's minor number


def gpu(i: int, used: int | None = 0, minor: int | None = -1) -> GpuInfo:
    return GpuInfo(
        i,
        f"GPU-{i:08d}",
        "NVIDIA H200",
        used,
        143771,
        0,
        bus_id=f"00000000:{0x18 + i:02X}:00.0",
        minor=MINORS.get(i, i) if minor == -1 else minor,
    )


def proc(
    pid: int,
    g: int,
    user: str | None = "alice",
    mib: int | None = 1000,
    *,
    visible: bool = True,
    name: str = "/usr/bin/python3",
    ticks: int | None = 100,
    uid: int | None = AUTO,
    real_uid: int | None = AUTO,
    exe: str | None = "",
    argv0: str | None = None,
) -> GpuProcess:
    """A process; ``name`` is what it says it runs, and by default also its exe and argv[0]."""
    uid = UIDS.get(user or "") if uid == AUTO else uid
    real_uid = uid if real_uid == AUTO else real_uid
    return GpuProcess(
        pid,
        g,
        mib if visible else None,
        name.rsplit("/", 1)[-1][:15],
        visible,
        True,
        user,
        ppid=1,
        state="S",
        start_ticks=ticks,
        command=f"{name} train.py",
        uid=uid,
        real_uid=real_uid,
        exe=name if exe == "" else exe,
        argv0=name if argv0 is None else argv0,
    )


SNAP = NodeSnapshot(
    "node1",
    0.0,
    (gpu(0, 1000), gpu(1, 3000), gpu(2, 500), gpu(3, 0), gpu(4, 1300)),
    (
        proc(10, 0),
        proc(11, 1, "bob", 2000),
        proc(12, 1, mib=1000),
        proc(13, 1, "carol", visible=False),  # hidden: device file only
        proc(14, 2, "root", 500, name=PERSISTENCED),  # the protected daemon
        proc(15, 1, "alice", 500),  # also on GPU 2 below
        proc(15, 2, "alice", 0),
        proc(16, 3, "dave", 100, ticks=None, uid=None),  # listed but gone from /proc
        # GPU 4: things that look like the daemon, and one whose owner is unknown
        proc(17, 4, "alice", 700, name=PERSISTENCED),  # alice runs the daemon's own executable
        proc(
            18, 4, "alice", 300, name="nvidia-persistenced", exe=None, argv0=PERSISTENCED
        ),  # a job named like it, exe unreadable, argv[0] forged
        proc(19, 4, None, 200, uid=None),  # /proc gave no uid
        proc(20, 4, "root", 100, name=PERSISTENCED, real_uid=1000),  # setuid, started by alice
    ),
)


def plan(**kw: object) -> ResetPlan:
    req = ResetRequest("node1", kw.pop("requester", "alice"), **kw)  # type: ignore[arg-type]
    return plan_reset(SNAP, req, PROTECTION)


@pytest.mark.parametrize(
    ("kw", "targets", "forced"),
    [
        ({"gpus": (0,)}, [10], False),
        ({"gpus": (1,)}, [11, 12, 13, 15], True),
        ({"gpus": (1,), "user": "alice"}, [12, 15], False),
        ({"pids": (12,)}, [12], False),
        ({"gpus": (2,)}, [15], False),  # the protected daemon is left alone
        ({"gpus": (3,)}, [], False),  # nothing to signal: the listed pid is gone
        ({}, [10, 11, 12, 13, 15, 17, 18, 20], True),
        ({"gpus": (0,), "requester": None}, [10], True),
        # named like the daemon, even running its executable: alice's jobs are targets
        ({"gpus": (4,), "user": "alice"}, [17, 18], False),
        ({"gpus": (4,), "user": "alice", "requester": "bob"}, [17, 18], True),
        ({"pids": (17,), "requester": "bob"}, [17], True),
        ({"pids": (18,), "requester": "bob"}, [18], True),
        ({"gpus": (4,), "requester": "bob"}, [17, 18, 20], True),  # setuid root is no daemon
    ],
)
def test_targets(kw: dict[str, object], targets: list[int], forced: bool) -> None:
    p = plan(**kw)
    assert sorted(t.pid for t in p.targets) == targets
    assert p.forced is forced


def test_targets_carry_their_owner() -> None:
    uids = {t.pid: t.uid for t in plan().targets}
    assert uids == {10: 1000, 11: 1001, 12: 1000, 13: 1002, 15: 1000, 17: 1000, 18: 1000, 20: 0}


def test_a_job_named_like_the_daemon_is_forced_for_another_requester() -> None:
    p = plan(gpus=(4,), user="alice", requester="bob")
    (t17, t18) = p.targets
    assert (t17.user, t17.forced, t17.command) == ("alice", True, f"{PERSISTENCED} train.py")
    assert (t18.user, t18.forced) == ("alice", True)
    assert p.forced and p.owners == ("alice",)
    assert not any(s.protected for s in p.skipped)


def test_protected_daemon_is_skipped_and_listed() -> None:
    p = plan(gpus=(2,))
    (s,) = p.skipped
    assert (s.pid, s.gpu, s.user, s.reason, s.protected, s.mib) == (
        14,
        2,
        "root",
        "protected system daemon",
        True,
        500,
    )
    assert s.start_ticks == 100 and s.command == f"{PERSISTENCED} train.py"
    assert p.expected_after_mib == {2: 500}  # its memory stays
    assert [t.pid for t in p.targets] == [15]


def test_system_user_daemon_known_by_argv0_is_protected() -> None:
    """Without root the exe of a system account's process is unreadable: argv[0] stands in."""
    d = proc(30, 0, "nvidia-persistenced", 400, name=PERSISTENCED, exe=None)
    s = NodeSnapshot("node1", 0.0, (gpu(0, 1400),), (d, proc(31, 0)))
    p = plan_reset(s, ResetRequest("node1", "alice"), PROTECTION)
    assert [t.pid for t in p.targets] == [31]
    assert [(k.pid, k.protected) for k in p.skipped] == [(30, True)]
    deleted = replace(d, exe=PERSISTENCED + " (deleted)", argv0="x")  # after a package upgrade
    p = plan_reset(replace(s, processes=(deleted,)), ResetRequest("node1", "alice"), PROTECTION)
    assert p.targets == () and p.skipped[0].protected


@pytest.mark.parametrize(
    "protection",
    [
        Protection(paths=(), system_users=("root",)),  # no daemon configured
        Protection(paths=(PERSISTENCED,), system_users=("nvidia-persistenced",)),  # not root
        Protection(paths=("nvidia-persistenced",), system_users=("root",)),  # names never match
    ],
)
def test_protection_is_what_is_configured(protection: Protection) -> None:
    p = plan_reset(SNAP, ResetRequest("node1", "root", gpus=(2,)), protection)
    assert 14 in [t.pid for t in p.targets] and not any(s.protected for s in p.skipped)


def test_unknown_owner_is_skipped() -> None:
    p = plan(gpus=(4,), requester="bob")
    assert [(s.pid, s.reason, s.protected, s.mib) for s in p.skipped] == [
        (19, "owner unknown (nothing to check a signal against)", False, 200)
    ]
    assert p.expected_after_mib == {4: 200}
    by_pid = plan(pids=(19,))  # asked for by pid, it is still not signalled
    assert by_pid.targets == ()
    assert {k.pid: k.reason for k in by_pid.skipped}[19].startswith("owner unknown")


@pytest.mark.parametrize(
    "kw",
    [
        {"pids": (14,)},
        {"pids": (12, 14)},
        {"pids": (14,), "gpus": (2,)},
        {"pids": (14,), "requester": "root"},
    ],
)
def test_pid_request_on_a_protected_daemon_is_refused(kw: dict[str, object]) -> None:
    with pytest.raises(ResetRefused) as ei:
        plan(**kw)
    assert str(ei.value) == (
        f"pid 14 on node1 is a protected system daemon ({PERSISTENCED}, run "
        "by root): gpubot never signals it"
    )


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
    assert (11, "not owned by alice") in reasons and (14, "protected system daemon") in reasons
    assert {s.pid: s.protected for s in p.skipped} == {11: False, 13: False, 14: True}


def test_plan_round_trips_through_dict() -> None:
    for p in (plan(gpus=(1,)), plan(), plan(gpus=(2, 4), requester="bob")):
        assert ResetPlan.from_dict(p.to_dict()) == p


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"gpus": (9,)}, "node1 has no GPU 9 (GPUs: 0, 1, 2, 3, 4)"),
        ({"pids": (999,)}, "pid 999 holds no GPU on node1"),
        ({"gpus": (0,), "pids": (12,)}, "pid 12 is not on GPU 0"),
    ],
)
def test_bad_requests(kw: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan(**kw)


# ---- a GPU whose device file is unknown ---------------------------------------------------------

# GPU 1's minor is unknown: its device file's holders (hidden ones included) cannot be listed.
BLIND = replace(SNAP, gpus=tuple(replace(g, minor=None) if g.index == 1 else g for g in SNAP.gpus))


def blind(**kw: object) -> ResetPlan:
    req = ResetRequest("node1", kw.pop("requester", "alice"), **kw)  # type: ignore[arg-type]
    return plan_reset(BLIND, req, PROTECTION)


@pytest.mark.parametrize(
    "kw",
    [
        {"gpus": (1,)},
        {"gpus": (1,), "user": "alice"},  # a user's share of it still needs its holders
        {"gpus": (0, 1)},
        {},  # every GPU, this one among them
        {"requester": "root"},
    ],
)
def test_gpu_wide_request_on_an_unknown_device_file_is_refused(kw: dict[str, object]) -> None:
    with pytest.raises(ResetRefused) as ei:
        blind(**kw)
    assert str(ei.value) == (
        "node1: gpubot cannot tell which device file is GPU 1 (the driver names no Device Minor "
        "for its bus id), so it cannot see who holds it; reset by pid instead"
    )


def test_unknown_device_file_of_one_gpu_does_not_refuse_another() -> None:
    for kw in ({"gpus": (0,)}, {"gpus": (2, 4), "requester": "bob"}):
        assert blind(**kw) == plan(**kw)


@pytest.mark.parametrize(
    "kw",
    [
        {"pids": (12,)},
        {"pids": (11, 12), "requester": "root"},
        {"pids": (12,), "gpus": (1,)},  # pids narrowed to the GPU: still a pid request
        {"pids": (15,)},  # on GPU 1 and GPU 2
        {"pids": (10, 12)},  # one GPU known, one not
    ],
)
def test_pid_request_plans_on_a_gpu_whose_device_file_is_unknown(kw: dict[str, object]) -> None:
    p = blind(**kw)
    assert p == plan(**kw)
    pids = kw["pids"]
    assert isinstance(pids, tuple) and sorted(t.pid for t in p.targets) == sorted(pids)
    assert 1 in p.gpus


def test_a_minor_is_never_guessed_from_the_index() -> None:
    """Any minor at all is enough; it need not equal the index."""
    s = NodeSnapshot("node1", 0.0, (gpu(0, 1000, minor=7),), (proc(10, 0),))
    p = plan_reset(s, ResetRequest("node1", "alice"), PROTECTION)
    assert [t.pid for t in p.targets] == [10]
    s = replace(s, gpus=(gpu(0, 1000, minor=None),))
    with pytest.raises(ResetRefused, match="which device file is GPU 0"):
        plan_reset(s, ResetRequest("node1", "alice"), PROTECTION)


# --- workloads: the owner of a container or job decides self-service -----------------------

CID = "ab" * 32


def in_workload(p: GpuProcess, w: Workload) -> GpuProcess:
    return replace(p, workload=decide_owner(w, {v: k for k, v in UIDS.items()}, "owner"))


LABELLED = Workload("docker", CID, "train-llama").with_detail(
    image="pytorch:24.05", **{"label.owner": "alice"}
)
UNLABELLED = Workload("docker", CID, "train-llama")
JOB = Workload("slurm", "8812", "sweep-lr").with_detail(uid="1001", step="0")


def one(p: GpuProcess) -> NodeSnapshot:
    return NodeSnapshot("node1", 0.0, (gpu(0, p.used_memory_mib),), (p,))


@pytest.mark.parametrize(
    ("p", "requester", "forced", "owner"),
    [
        # alice's labelled container runs as root: hers, self-service, even under min_uid
        (in_workload(proc(30, 0, "root"), LABELLED), "alice", False, "alice"),
        (in_workload(proc(30, 0, "root"), LABELLED), "bob", True, "alice"),
        # no label: root's, so a forced kill for everyone
        (in_workload(proc(30, 0, "root"), UNLABELLED), "alice", True, "root"),
        (in_workload(proc(30, 0, "root"), UNLABELLED), "root", True, "root"),
        # a Slurm job is its job user's
        (in_workload(proc(31, 0, "bob"), JOB), "bob", False, "bob"),
        (in_workload(proc(31, 0, "bob"), JOB), "alice", True, "bob"),
        # a session names no owner: the process's uid decides, as before
        (
            in_workload(
                proc(32, 0, "root"),
                Workload("session", "session-1.scope").with_detail(uid="1000"),
            ),
            "alice",
            True,
            "root",
        ),
    ],
)
def test_the_workload_owner_decides_self_service(
    p: GpuProcess, requester: str, forced: bool, owner: str
) -> None:
    req = ResetRequest("node1", requester, gpus=(0,), min_uid=1000)
    (t,) = plan_reset(one(p), req, PROTECTION).targets
    assert (t.forced, t.owner) == (forced, owner)


def test_plans_say_what_is_killed_and_survive_a_round_trip() -> None:
    p = in_workload(proc(30, 0, "root"), LABELLED)
    got = plan_reset(one(p), ResetRequest("node1", "alice", gpus=(0,), min_uid=1000), PROTECTION)
    said = "container `train-llama` (image `pytorch:24.05`) of Linux user `alice`"
    assert got.targets[0].reasons[0] == f"kills {said}"
    assert got.workloads == (said,) and got.owners == ("alice",)
    back = ResetPlan.from_dict(json.loads(json.dumps(got.to_dict())))
    assert back == got


def test_reset_of_a_users_processes_includes_their_containers() -> None:
    c = in_workload(proc(30, 0, "root"), LABELLED)
    snap = NodeSnapshot("node1", 0.0, (gpu(0, 2000),), (c, proc(33, 0, "bob")))
    got = plan_reset(snap, ResetRequest("node1", "alice", gpus=(0,), user="alice"), PROTECTION)
    assert [t.pid for t in got.targets] == [30]
