"""A rootless container's processes are its user's, whoever they run as inside (issue 34).

Inside a rootless container a non-root user is a subordinate uid (231072) with no passwd entry.
The owner comes from what root controls: the ``user-U.slice`` of the process's cgroup path
(the published kepler sample of a rootless podman container, ``tests/corpus/cgroup``). So its
GPU-hours, claim-intruder findings and forced-kill rule are that user's; a slice uid with no
name is said ``uid 1000``, never the subordinate uid. The process's own identity (its uids,
what every signal is checked against) does not change.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpubot.core.claims.rules import Claim, intruders
from gpubot.core.enrich import attribute
from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.probe.snapshot import parse_procs
from gpubot.core.reset.plan import ResetRequest, plan_reset
from gpubot.core.reset.protect import Protection
from gpubot.core.usage.hours import states_of
from gpubot.core.usage.idle import holder_owner
from gpubot.core.workload import decide_owner, parse_cgroup
from gpubot.errors import ParseError

CORPUS = Path(__file__).parents[1] / "corpus" / "cgroup"
ROOTLESS = (CORPUS / "kepler-podman-rootless.txt").read_text(encoding="utf-8")  # user-1000.slice
ROOTFUL = (CORPUS / "kepler-podman-rootful.txt").read_text(encoding="utf-8")
SUB = 231072  # a subordinate uid: no passwd entry, so the probe says its digits
T = 1_900_000_000.0


def proc(pid: int, uid: int, user: str, cgroup: str, gpu: int = 0) -> GpuProcess:
    return GpuProcess(
        pid,
        gpu,
        8192,
        "python3",
        True,
        True,
        user=user,
        state="S",
        start_ticks=500 + pid,
        elapsed_s=600,
        cgroup=cgroup,
        uid=uid,
        real_uid=uid,
        workload=parse_cgroup(cgroup),
    )


def node(*procs: GpuProcess) -> NodeSnapshot:
    gpus = tuple(GpuInfo(i, f"GPU-{i}", "H100", 8192, 81559, 0, minor=i) for i in (0, 1))
    return attribute(NodeSnapshot("n1", T, gpus, procs), None)


INSIDE = proc(40, SUB, str(SUB), ROOTLESS)  # a non-root user inside alice's rootless container
ALICE_ELSEWHERE = proc(41, 1000, "alice", "0::/user.slice/user-1000.slice/session-3.scope", 1)


@pytest.mark.parametrize(
    ("procs", "owner"),
    [
        ((INSIDE, ALICE_ELSEWHERE), "alice"),  # the slice's uid has a name on the node
        ((INSIDE,), "uid 1000"),  # it has none here: the slice's uid, never 231072
        ((proc(42, 1000, "alice", ROOTLESS),), "alice"),  # root inside: the user's own uid
        ((proc(43, SUB, str(SUB), ROOTFUL),), "root"),  # control: a rootful container
    ],
)
def test_a_rootless_containers_owner_is_its_user_slices(
    procs: tuple[GpuProcess, ...], owner: str
) -> None:
    snap = node(*procs)
    first = snap.processes[0]
    assert holder_owner(first) == owner
    assert (first.uid, first.real_uid, first.user) == (procs[0].uid, procs[0].uid, procs[0].user)


def test_the_report_counts_its_gpu_hours_for_the_slices_user() -> None:
    (gpu0, _) = states_of([node(INSIDE, ALICE_ELSEWHERE)])
    assert gpu0.owners == ("alice",)
    (unnamed, _) = states_of([node(INSIDE)])
    assert unnamed.owners == ("uid 1000",)


def claim(user: str) -> Claim:
    return Claim(1, "n1", 0, "GPU-0", user, "U0" + user.upper(), T - 3600, T + 3600, "")


def test_the_intruder_finding_names_the_slices_user() -> None:
    snap = node(INSIDE, ALICE_ELSEWHERE)
    (found,) = intruders(snap, [claim("bob")])
    f = found.finding()
    assert f.owner == "alice" and f.summary.startswith("alice's podman:")
    assert str(SUB) not in f.summary.split(" on GPU")[0]
    assert intruders(snap, [claim("alice")]) == []  # her own container on her own claim


def test_control_without_the_slice_the_subordinate_uid_was_the_owner() -> None:
    """The attack as it was: the workload names no owner, so the process's uid does."""
    snap = node(INSIDE)
    w = snap.processes[0].workload
    assert w is not None and w.owner == "uid 1000"
    bare = replace(snap.processes[0], workload=replace(w, owner=None))
    assert holder_owner(bare) == str(SUB)
    (found,) = intruders(replace(snap, processes=(bare,)), [claim("alice")])
    assert found.finding().owner == str(SUB)  # alice's own container, an intruder on her claim


def test_killing_it_is_self_service_for_the_slices_user_only() -> None:
    snap = node(INSIDE, ALICE_ELSEWHERE)

    def forced(requester: str) -> bool:
        req = ResetRequest("n1", requester, gpus=(0,), min_uid=1000)
        return plan_reset(snap, req, Protection()).forced

    assert not forced("alice")
    assert forced("bob")
    (t,) = plan_reset(snap, ResetRequest("n1", "alice", gpus=(0,)), Protection()).targets
    assert (t.owner, t.uid, t.user) == ("alice", SUB, str(SUB))  # signalled as what it is


ROOTLESS_CG = (
    "0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-"
    + "ab" * 32
    + ".scope/container"
)


def _listing(cgroup: str, names: str) -> str:
    line = f"p 7 S 1 10 231072 231072 =x =x\\000 ! ={cgroup} =0"
    return f"\n@gpubot procs\nc 100 5.0\n{line}\n{names}\n@gpubot end\n"


def test_the_probe_names_a_rootless_containers_slice_user() -> None:
    """The probe's ``u`` line for the slice uid names the owner; the process keeps its uid."""
    info = parse_procs(_listing(ROOTLESS_CG, "u 231072 !\nu 1000 =alice"), [7])[7]
    assert (info.uid, info.user) == (231072, "231072")
    assert info.workload is not None
    assert decide_owner(info.workload, {}, None).owner == "alice"


@pytest.mark.parametrize(
    "cgroup",
    [
        "0::/system.slice/a.service",
        "0::/user.slice/user-1000.slice/session-3.scope",
        "0::/user.slice/user-1000.slice/user@1000.service/app.slice/job.scope",
        "0::/user.slice/user-1000.slice/user@1000.service/x\\0120::/forged.scope",
    ],
)
def test_an_extra_name_that_is_no_rootless_slice_names_no_one(cgroup: str) -> None:
    """A user's own scope under their systemd, or a subordinate uid outside a container, gets
    its slice uid named too: that name is ignored, and the node's probe does not fail."""
    info = parse_procs(_listing(cgroup, "u 231072 !\nu 1000 =alice"), [7])[7]
    assert info.uid == 231072 and info.user == "231072"
    w = info.workload
    assert w is None or w.get("uid_name") is None


def test_a_missing_name_for_a_processs_own_uid_is_still_an_error() -> None:
    with pytest.raises(ParseError, match="owner names"):
        parse_procs(_listing(ROOTLESS_CG, "u 1000 =alice"), [7])
