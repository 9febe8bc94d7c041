"""The pure parts of the stop gate: which cgroups a workload's stop is checked over, whose uid,
how the node's answer is read, and the words a refusal is said in."""

from __future__ import annotations

import pytest

from gpubot.core.models import Outcome
from gpubot.core.reset.outcome import GpuResult
from gpubot.core.reset.plan import ResetPlan, Target
from gpubot.core.reset.stop_script import (
    Foreign,
    StopCheck,
    check_path,
    parse_stop_output,
    stop_check_argv,
)
from gpubot.core.reset.stopgate import (
    gate_for,
    plan_stop_notes,
    refusal,
    requester_uid,
    stop_cgroups,
    stop_note,
    workload_root,
)
from gpubot.core.workload import Workload, parse_cgroup
from gpubot.errors import ParseError
from gpubot.services.workloads import annotate

CID = "4f" * 32
SVC = Workload("service", "x.service")
JOB = Workload("slurm", "8812", owner="alice").with_detail(uid="1001", step="0")
DOCKER = Workload("docker", CID, name="trainer")
PODMAN = Workload("podman", CID)
POD = Workload("kubernetes", CID)


@pytest.mark.parametrize(
    ("path", "w", "root"),
    [
        ("/system.slice/x.service", SVC, "/system.slice/x.service"),
        ("/system.slice/x.service/sub/deeper", SVC, "/system.slice/x.service"),
        ("/system.slice/app.slice/x.service", SVC, "/system.slice/app.slice/x.service"),
        ("/system.slice/y.service", SVC, None),
        (f"/system.slice/docker-{CID}.scope", DOCKER, f"/system.slice/docker-{CID}.scope"),
        (f"/docker/{CID}", DOCKER, f"/docker/{CID}"),
        (f"/docker/{'ab' * 32}/docker/{CID}", DOCKER, f"/docker/{'ab' * 32}/docker/{CID}"),
        (
            f"/machine.slice/libpod-{CID}.scope/container",
            PODMAN,
            f"/machine.slice/libpod-{CID}.scope",
        ),
        (f"/libpod_parent/libpod-{CID}", PODMAN, f"/libpod_parent/libpod-{CID}"),
        # The whole job, not its step or task: scancel ends every step.
        ("/slurm/uid_1001/job_8812/step_0/task_0", JOB, "/slurm/uid_1001/job_8812"),
        ("/slurm_n1/uid_1001/job_8812/step_batch", JOB, "/slurm_n1/uid_1001/job_8812"),
        (
            "/system.slice/slurmstepd.scope/job_8812/step_0/user/task_0",
            JOB,
            "/system.slice/slurmstepd.scope/job_8812",
        ),
        ("/slurm/uid_1001/job_88120/step_0", JOB, None),
        (f"/kubepods/pod{'1' * 36}/{CID}", POD, None),  # no stop command: never checked
    ],
)
def test_the_workload_root_is_its_own_cgroup(path: str, w: Workload, root: str | None) -> None:
    assert workload_root(path, w) == root


def test_stop_cgroups_take_every_hierarchy_and_every_process() -> None:
    a = "12:memory:/system.slice/x.service\n1:name=systemd:/system.slice/x.service\n0::/\n"
    b = "1:name=systemd:/system.slice/x.service/helper\n0::/system.slice/x.service/helper\n"
    assert stop_cgroups([a, b, None], SVC) == (
        ("", "/system.slice/x.service"),
        ("memory", "/system.slice/x.service"),
        ("name=systemd", "/system.slice/x.service"),
    )
    # A text the kernel would not write (a forged line) names nothing.
    assert stop_cgroups(["0::/system.slice/x.service\n0::/system.slice/x.service\n"], SVC) == ()
    assert stop_cgroups(["0::/system.slice/../system.slice/x.service\n"], SVC) == ()


def _plan(requester: str | None, *targets: tuple[str, int, str], forced: bool = False) -> ResetPlan:
    return ResetPlan(
        "node1",
        (0,),
        tuple(
            Target(
                pid=100 + i,
                start_ticks=1,
                user=user,
                gpus=(0,),
                mib=1,
                command="x",
                reasons=(),
                uid=uid,
                owner=owner,
                forced=forced,
            )
            for i, (user, uid, owner) in enumerate(targets)
        ),
        (),
        requester,
    )


def test_the_requesters_uid_is_known_only_when_the_plan_makes_it_clear() -> None:
    assert requester_uid(_plan("alice", ("alice", 1001, "alice")), SVC) == 1001
    assert (
        requester_uid(_plan("alice", ("alice", 1001, "alice"), ("alice", 1002, "alice")), SVC)
        is None
    )
    # A labelled root container: its process is root's; alice's uid is not known from it.
    assert requester_uid(_plan("alice", ("root", 0, "alice")), DOCKER) is None
    # A Slurm job of hers: the uid of its root-made cgroup path.
    assert requester_uid(_plan("alice", ("root", 0, "alice")), JOB) == 1001
    assert requester_uid(_plan(None, ("alice", 1001, "alice")), SVC) is None


def test_a_self_service_stop_is_gated_and_a_forced_one_is_not() -> None:
    texts = ["0::/system.slice/x.service\n"]
    argv = ["systemctl", "stop", "x.service"]
    g = gate_for(_plan("alice", ("alice", 1001, "alice")), SVC, argv, texts, "node1")
    assert (g.gate, g.uid, g.why_not, g.cgroups) == (
        True,
        1001,
        None,
        (("", "/system.slice/x.service"),),
    )
    g = gate_for(_plan("bob", ("alice", 1001, "alice"), forced=True), SVC, argv, texts, "node1")
    assert (g.gate, g.uid, g.why_not) == (False, None, None)
    g = gate_for(
        _plan("alice", ("root", 0, "alice")),
        DOCKER,
        ["docker", "stop", "trainer"],
        [f"0::/docker/{CID}\n"],
        "node1",
    )
    assert g.why_not is not None and "does not know the uid of user alice on node1" in g.why_not
    g = gate_for(_plan("alice", ("alice", 1001, "alice")), SVC, argv, ["0::/\n"], "node1")
    assert g.why_not is not None and "saw no cgroup of unit `x.service`" in g.why_not


def test_the_argv_carries_everything_as_arguments() -> None:
    argv = stop_check_argv(
        ["systemctl", "stop", "x.service"],
        [("", "/system.slice/x.service"), ("name=systemd", "/a b/$(id)")],
        uid=1001,
        gate=True,
        sudo=True,
        kind="service",
        note='stop service "x.service"; $(id)',
    )
    assert argv[:2] == ["sh", "-c"] and "x.service" not in argv[2]
    assert argv[3:] == [
        "gpubot-stop",
        "1",
        "1001",
        "1",
        "service",
        'stop service "x.service"; $(id)',  # the node's log line: one argument
        "2",
        ":/system.slice/x.service",
        "name=systemd:/a b/$(id)",
        "systemctl",
        "stop",
        "x.service",
    ]
    with pytest.raises(ValueError, match="requester's uid"):
        stop_check_argv(["true"], [], uid=None, gate=True, sudo=False, kind="service")
    for bad in ("/", "relative", "/a/../b", "/a//b", "/a\nb", "/a/./b"):
        assert not check_path(bad)
        with pytest.raises(ValueError, match="not a cgroup"):
            stop_check_argv(["true"], [("", bad)], uid=1, gate=True, sudo=False, kind="service")


def test_the_nodes_answer_is_read_up_to_its_verdict() -> None:
    text = (
        "unreadable 2\nforeign 42 1002 1002\nuser 1002 bob\nuser 0 bad name\nunknown 7\n"
        "checked 3 foreign 1\nrefused\n"
    )
    assert parse_stop_output(text) == StopCheck(
        stopping=False,
        refused=True,
        checked=3,
        foreign=(Foreign(42, 1002, 1002),),
        foreign_count=1,
        unknown=(7,),
        unreadable=(2,),
        names=((1002, "bob"),),
    )
    done = parse_stop_output("checked 2 foreign 0\nstopping\nforeign 1 2 3\nrefused\n")
    assert done.stopping and done.output == "foreign 1 2 3\nrefused"  # the stop's own words
    assert parse_stop_output("checked 1 foreign 0\n") == StopCheck(False, False, checked=1)
    for bad in ("foreign x 1 2\nrefused\n", "rm -rf /\nrefused\n", "checked 1 x 2\n"):
        with pytest.raises(ParseError):
            parse_stop_output(bad)


def test_refusals_say_why_in_words() -> None:
    check = StopCheck(
        False,
        True,
        3,
        (Foreign(42, 1002, 1002), Foreign(43, 1000, 0)),
        7,
        names=((1002, "bob"), (0, "root")),
    )
    assert refusal(check, "unit `x.service`") == (
        "unit `x.service` also runs processes of uid 0 (root), uid 1000, uid 1002 (bob), "
        "pid 42, 43 and 5 more: stopping it needs an on-call approval"
    )
    assert "could not read the cgroup" in refusal(StopCheck(False, True, unreadable=(1,)), "u")
    assert "(pid 9)" in refusal(StopCheck(False, True, unknown=(9,)), "u")
    assert "no process" in refusal(StopCheck(False, True), "u")
    assert "gave no verdict" in refusal(None, "u")


def test_scancel_says_it_ends_the_job_on_every_node() -> None:
    assert (
        stop_note(JOB)
        == "`scancel 8812` ends the job on every node it runs on, not only on this one"
    )
    assert stop_note(SVC) is None and stop_note(None) is None
    job = parse_cgroup("0::/system.slice/slurmstepd.scope/job_77/step_0/user/task_0\n")
    assert job is not None
    plan = ResetPlan("n", (0,), (Target(1, 1, "a", (0,), 1, "x", (), workload=job),), (), "a")
    (note,) = plan_stop_notes(plan)
    assert note == (
        "If it restarts, the fix is `scancel 77`: it stops every process of Slurm job 77, "
        "whoever runs them; `scancel 77` ends the job on every node it runs on, not only on "
        "this one"
    )


def test_a_respawned_gpus_outcome_says_why_and_what_scancel_ends() -> None:
    g = GpuResult(0, Outcome.RESPAWNED, "pid 5 took the GPU again", 10, 10, None)
    free = GpuResult(1, Outcome.FREED, "memory at 0 MiB", 10, 0, 1.0)
    out = annotate((g, free), {0: JOB, 1: JOB}, {0: "gpubot did not stop it: x"})
    assert out[0].detail == (
        "pid 5 took the GPU again (gpubot did not stop it: x; `scancel 8812` ends the job on "
        "every node it runs on, not only on this one)"
    )
    assert out[1] == free
    assert annotate((g,), {0: SVC}, {}) == (g,)


SLUID_TEXT = "0::/system.slice/node1_slurmstepd.scope/s0123456789ABC/step_0/user/task_0\n"


def test_a_sluid_job_is_checked_over_its_own_cgroup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slurm 26.05 names a job's v2 cgroup by its SLUID (no ``job_``): the stop of
    ``scancel SLUID`` is checked over that cgroup, not refused for want of one (and a forced
    stop is not run over no cgroup at all). Control: the old rule (``job_ID`` only) finds none."""
    import gpubot.core.reset.stopgate as sg

    w = parse_cgroup(SLUID_TEXT)
    assert w is not None and w.kind == "slurm" and w.id == "s0123456789ABC"
    root = ("", "/system.slice/node1_slurmstepd.scope/s0123456789ABC")
    assert stop_cgroups([SLUID_TEXT], w) == (root,)
    # a digit job id is never taken from a bare component, only a SLUID is
    assert workload_root("/slurm/uid_1/job_7/7", Workload("slurm", "7")) == ("/slurm/uid_1/job_7")
    assert workload_root("/x/7/job_8", Workload("slurm", "7")) is None
    monkeypatch.setattr(
        sg, "_is_root_of", lambda w, comp, prev: comp == f"job_{w.id}"
    )  # the rule before the fix
    assert stop_cgroups([SLUID_TEXT], w) == ()
