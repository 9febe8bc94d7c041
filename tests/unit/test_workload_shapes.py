"""Issue 21's cgroup shapes: containerd's own unit nesting pods, containers in containers,
static pods, kind, LXC/LXD, Apptainer, and the runtimes' own units (never a workload)."""

from __future__ import annotations

import pytest

from gpubot.core.enrich import apply_enrichment, enrich_target
from gpubot.core.runtimes.base import Found
from gpubot.core.workload import (
    decide_owner,
    describe,
    may_restart,
    parse_cgroup,
    short_name,
    stop_argv,
    stop_command,
)
from tests.fixtures.node_samples import CID, POD, v2

OUT = "88ea268e" * 8  # an outer container's id
STATIC = "8daa50c3a64c9ff60bb9eab7b44b56fd"  # a static pod's UID: 32 hex digits, no dashes
UPOD = POD.replace("-", "_")

# Shapes of issue 21, from the public sources in gpubot/core/runtimes/ and tests/corpus/.
MORE_SHAPES = [
    # containerd's own unit nesting pods (SystemdCgroup=false, kubelet on the systemd driver)
    (
        f"11:devices:/system.slice/containerd.service/kubepods-besteffort-pod{UPOD}.slice"
        f":cri-containerd:{CID}\n",
        "kubernetes",
        CID,
        {"pod_uid": POD, "qos": "besteffort", "runtime": "containerd", "container_id": CID},
    ),
    (
        f"1:name=systemd:/kuberuntime.slice/containerd.service/kubepods-pod{UPOD}.slice"
        f":cri-containerd:{CID}\n",
        "kubernetes",
        CID,
        {"qos": "guaranteed"},
    ),
    (
        f"4:memory:/kubepods-burstable-pod{UPOD}.slice:cri-containerd:{CID}\n",
        "kubernetes",
        CID,
        {"qos": "burstable"},
    ),
    # CRI-O and kubeadm static pods: 32 hex digits
    (
        v2(
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC}.slice"
            f"/crio-{CID}.scope"
        ),
        "kubernetes",
        CID,
        {"pod_uid": STATIC, "runtime": "cri-o"},
    ),
    (f"4:memory:/kubepods/pod{STATIC}/{CID}\n", "kubernetes", CID, {"pod_uid": STATIC}),
    (f"4:memory:/kubepods/besteffort/pod{STATIC}\n", "kubernetes", STATIC, {"pod_uid": STATIC}),
    # kind's --cgroup-root=/kubelet, on the host
    (
        v2(
            f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
            f"kubelet-kubepods-burstable-pod{UPOD}.slice/cri-containerd-{CID}.scope"
        ),
        "kubernetes",
        CID,
        {"pod_uid": POD, "qos": "burstable"},
    ),
    # docker-in-docker and a kind node's pods: the innermost container, tied to the outer one
    (
        f"4:memory:/docker/{OUT}/docker/{CID}\n",
        "docker",
        f"{OUT}/{CID}",
        {"outer": OUT, "outer_kind": "docker", "inner_id": CID},
    ),
    (
        v2(
            f"/system.slice/docker-{OUT}.scope/kubelet.slice/kubelet-kubepods.slice/"
            f"kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UPOD}.slice/"
            f"cri-containerd-{CID}.scope"
        ),
        "kubernetes",
        f"{OUT}/{CID}",
        {"outer": OUT, "pod_uid": POD, "inner_id": CID},
    ),
    (
        f"5:memory:/docker/{OUT}/kubelet/kubepods/burstable/pod{POD}/{CID}\n"
        f"0::/docker/{OUT}/system.slice/containerd.service\n",
        "kubernetes",
        f"{OUT}/{CID}",
        {"outer": OUT},
    ),
    (
        f"4:memory:/kubepods/burstable/pod{POD}/{OUT}/docker/{CID}\n",
        "docker",
        f"{OUT}/{CID}",
        {"outer": OUT, "outer_kind": "kubernetes", "outer_pod_uid": POD},
    ),
    (v2(f"/docker/{OUT}/docker/{OUT}/docker/{CID}"), "docker", f"{OUT}/{CID}", {"inner_id": CID}),
    # a container's own cgroups that are no container: the outer one is the workload
    (v2(f"/docker/{OUT}/system.slice/containerd.service"), "docker", OUT, {}),
    (v2(f"/docker/{OUT}/init.scope"), "docker", OUT, {}),
    # LXC and LXD
    ("12:memory:/lxc/web01\n", "lxc", "web01", {}),
    (v2("/lxc.payload.waydroid"), "lxc", "waydroid", {}),
    (v2("/lxc.payload.web01/system.slice/nginx.service"), "lxc", "web01", {}),
    (
        v2(f"/lxc.payload.web01/system.slice/docker-{CID}.scope"),
        "docker",
        f"web01/{CID}",
        {"outer_kind": "lxc"},
    ),
    ("4:memory:/lxc.payload/c1\n", "lxc", "c1", {}),
]


@pytest.mark.parametrize(("text", "kind", "wid", "detail"), MORE_SHAPES)
def test_more_real_shapes(text: str, kind: str, wid: str, detail: dict[str, str]) -> None:
    w = parse_cgroup(text)
    assert w is not None
    assert (w.kind, w.id) == (kind, wid)
    assert detail.items() <= dict(w.detail).items()


# A runtime's own unit holds its daemon and shims: never a workload, never stopped.
@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/system.slice/containerd.service", "runtime daemon's own unit"),
        ("/system.slice/docker.service", "runtime daemon's own unit"),
        ("/system.slice/crio.service", "runtime daemon's own unit"),
        ("/system.slice/kubelet.service", "runtime daemon's own unit"),
        ("/system.slice/podman.service", "runtime daemon's own unit"),
        ("/system.slice/slurmd.service", "runtime daemon's own unit"),
        ("/system.slice/slurmstepd.scope", "runtime daemon's own unit"),
        ("/system.slice/slurmstepd.scope/system", "runtime daemon's own unit"),
        ("/system.slice/node7_slurmstepd.scope/system", "runtime daemon's own unit"),
        ("/system.slice/k3s.service", "runtime daemon's own unit"),
        # No pam_systemd: users' logins and cron jobs stay in the daemon's unit.
        (
            "/system.slice/ssh.service",
            "a login or cron daemon's own unit: it holds other users' sessions too",
        ),
        (
            "/system.slice/cron.service",
            "a login or cron daemon's own unit: it holds other users' sessions too",
        ),
        (
            "/system.slice/getty@tty1.service",
            "a login or cron daemon's own unit: it holds other users' sessions too",
        ),
        (
            "/system.slice/containerd.service/kubepods-pod-nothing-known",
            "runtime daemon's own unit",
        ),
        ("/kuberuntime.slice/containerd.service", "runtime daemon's own unit"),
        ("/lxc.monitor.web01", "LXC's monitor of a container, not the container"),
        ("/system.slice/singularity-4242.scope", "Apptainer cgroup named by its starter's PID"),
        ("/singularity/4242", "Apptainer cgroup named by its starter's PID"),
        (
            "/ecs/8474ac4cec7a4f488834b00591271ec3/8474ac4cec7a4f488834b00591271ec3-3054012820",
            "no known workload shape",
        ),
    ],
)
def test_a_runtimes_own_unit_is_never_a_workload(path: str, reason: str) -> None:
    w = parse_cgroup(v2(path))
    assert w is not None and w.kind == "other"
    assert (w.get("reason") or "").startswith(reason)
    assert stop_command(w) is None and stop_argv(w) is None and not may_restart(w)
    assert decide_owner(w, {0: "root"}, "owner").owner is None


def test_a_runtimes_unit_was_a_service_before_the_rule() -> None:
    """Control: without the daemon rule, containerd's unit is a service to stop (every pod)."""
    from gpubot.core import workload

    rule = [s for s in workload.SHAPES if "reason_daemon" in s[1].pattern]
    assert len(rule) == 1
    without = tuple(s for s in workload.SHAPES if s not in rule)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("gpubot.core.workload.SHAPES", without)
        w = parse_cgroup(v2("/system.slice/containerd.service"))
    assert w is not None and w.kind == "service"
    assert stop_command(w) == "systemctl stop containerd.service"


@pytest.mark.parametrize(
    "path",
    [
        # a user's own subtree: theirs, whatever it is called
        f"/user.slice/user-1000.slice/user@1000.service/kubepods-pod{UPOD}.slice:cri-containerd:{CID}",
        f"/user.slice/user-1000.slice/user@1000.service/app.slice/containerd.service/kubepods-pod"
        f"{UPOD}.slice:cri-containerd:{CID}",
        "/user.slice/user-1000.slice/user@1000.service/lxc.payload.web01",
        "/user.slice/user-1000.slice/user@1000.service/lxc/web01",
        f"/user.slice/user-1000.slice/user@1000.service/docker/{OUT}/docker/{CID}",
        # not root's prefix, or not the shape
        f"/home/kubepods-pod{UPOD}.slice:cri-containerd:{CID}",
        f"/system.slice/containerd.service/kubepods-pod{UPOD}.slice:cri-containerd:{CID[:12]}",
        f"/kubepods/pod{STATIC[:31]}/{CID}",  # 31 hex digits: no pod UID
        "/lxc/-rf",
        "/lxc/a b",
    ],
)
def test_lookalikes_of_the_new_shapes(path: str) -> None:
    w = parse_cgroup(v2(path))
    assert w is not None
    assert w.kind in ("session", "other")
    assert decide_owner(w, {0: "root", 1000: "alice"}, "owner").owner is None
    assert stop_command(w) is None or w.kind == "session"


def test_a_container_inside_another_is_tied_to_the_outer_one() -> None:
    w = parse_cgroup(f"4:memory:/docker/{OUT}/docker/{CID}\n")
    assert w is not None and short_name(w) == f"docker:{CID[:12]}"
    assert stop_command(w) is None and stop_argv(w) is None  # the host's docker knows no inner
    assert may_restart(w)  # the inner daemon's policy is unknown: watch it
    owned = decide_owner(w.with_detail(**{"label.owner": "alice", "outer_name": "ci"}), {}, "owner")
    assert owned.owner == "alice"  # the outer container's owner owns what runs inside it
    assert describe(owned) == (
        f"docker container `{CID[:12]}` inside container `ci` of Linux user `alice`"
    )
    rootless = parse_cgroup(
        v2(
            f"/user.slice/user-1000.slice/user@1000.service/user.slice/docker-{OUT}.scope"
            f"/docker/{CID}"
        )
    )
    assert rootless is not None and rootless.get("rootless") == "yes"
    assert decide_owner(rootless, {1000: "alice"}, "owner").owner == "alice"


def test_a_forged_inner_id_never_names_the_container_it_copies() -> None:
    """The outer container's root names its nested cgroup after a victim container: the
    workload's id is not the victim's, and its lookup and owner are the outer container's."""
    victim = parse_cgroup(v2(f"/docker/{CID}"))
    forged = parse_cgroup(v2(f"/docker/{OUT}/docker/{CID}"))
    assert victim is not None and forged is not None
    assert (victim.kind, victim.id) != (forged.kind, forged.id)  # not merged by (kind, id)
    assert enrich_target(forged) == ("docker", OUT)
    outer = Found(name="mallory-ci", labels=(("owner", "mallory"),))
    named = apply_enrichment(forged, outer, "owner")
    assert (named.owner, named.name, stop_command(named)) == ("mallory", None, None)
    # Control: taken at its word, the inner id is the victim's: its lookup, and its stop.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("gpubot.core.workload._nest", lambda outer, inner: inner)
        naive = parse_cgroup(v2(f"/docker/{OUT}/docker/{CID}"))
    assert naive is not None and (naive.kind, naive.id) == (victim.kind, victim.id)
    assert enrich_target(naive) == ("docker", CID)
    assert stop_command(naive) == f"docker stop {CID[:12]}"


def test_a_nested_pods_lookup_is_the_outer_pods_container() -> None:
    w = parse_cgroup(f"4:memory:/kubepods/burstable/pod{POD}/{OUT}/docker/{CID}\n")
    assert w is not None and enrich_target(w) == ("crictl", OUT)
    mine = Found(name="dind", pod_uid=POD, labels=(("owner", "bob"),))
    assert apply_enrichment(w, mine, "owner").owner == "bob"
    other_pod = Found(
        name="dind", pod_uid="ffffffff-7b8a-4a51-9d1e-5c1f2a3b4c5d", labels=(("owner", "bob"),)
    )
    assert apply_enrichment(w, other_pod, "owner").owner == "root"  # another pod's: not found


def test_an_lxc_container_is_roots_and_has_no_stop_command() -> None:
    w = parse_cgroup(v2("/lxc.payload.web01"))
    assert w is not None and short_name(w) == "lxc:web01"
    assert decide_owner(w, {}, "owner").owner == "root"
    assert stop_command(w) is None and may_restart(w)
    assert describe(w) == "LXC/LXD container `web01`"


SLUID = "s5K1KKYAYG5D00"  # Slurm 26.05's job id in v2 cgroup paths (doc/html/cgroups.shtml)


@pytest.mark.parametrize(
    ("path", "step"),
    [
        (f"/system.slice/slurmstepd.scope/{SLUID}/step_0/user/task_0", "0"),
        (f"/system.slice/node7_slurmstepd.scope/{SLUID}/step_extern/slurm", "extern"),
    ],
)
def test_a_slurm_job_named_by_its_sluid(path: str, step: str) -> None:
    w = parse_cgroup(v2(path))
    assert w is not None and (w.kind, w.id, w.get("step")) == ("slurm", SLUID, step)
    assert stop_command(w) == f"scancel {SLUID}"  # scancel takes a SLUID since 26.05
    assert enrich_target(w) is None  # scontrol is asked by numeric job id only


@pytest.mark.parametrize(
    "path",
    [
        "/system.slice/slurmstepd.scope/s5K1KKYAYG5D0I/step_0",  # I is no Crockford digit
        "/system.slice/slurmstepd.scope/s5K1KKYAYG5D0/step_0",  # 12 digits
        "/system.slice/slurmstepd.scope/x5K1KKYAYG5D00/step_0",
        f"/user.slice/user-1000.slice/user@1000.service/system.slice/slurmstepd.scope/{SLUID}",
    ],
)
def test_sluid_lookalikes_name_no_job(path: str) -> None:
    w = parse_cgroup(v2(path))
    assert w is not None and w.kind in ("other", "session")
    assert stop_command(w) is None
