"""Workload attribution from /proc/PID/cgroup: real path shapes, hostile names, owners, fixes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpubot.core.workload import (
    Workload,
    cgroup_paths,
    decide_owner,
    describe,
    may_restart,
    parse_cgroup,
    short_name,
    stop_argv,
    stop_command,
)
from tests.fixtures.node_samples import CID, POD, v2

HYBRID_ROOT = "9:name=systemd:/\n8:pids:/\n4:memory:/\n1:cpu:/\n"


# (cgroup file, kind, id, detail that must be there); shapes from Docker's, Podman's, the
# kubelet's and Slurm's cgroup docs and systemd.special(7).
SHAPES = [
    (v2(f"/system.slice/docker-{CID}.scope"), "docker", CID, {}),
    (f"12:memory:/docker/{CID}\n0::/\n", "docker", CID, {}),
    (v2(f"/machine.slice/libpod-{CID}.scope"), "podman", CID, {}),
    (f"3:memory:/libpod_parent/libpod-{CID}\n", "podman", CID, {}),
    (v2(f"/system.slice/docker-{CID}.scope/init.scope"), "docker", CID, {}),
    (
        v2(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{POD.replace('-', '_')}.slice/cri-containerd-{CID}.scope"
        ),
        "kubernetes",
        CID,
        {"pod_uid": POD, "qos": "burstable", "runtime": "containerd"},
    ),
    (
        v2(f"/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/crio-{CID}.scope"),
        "kubernetes",
        CID,
        {"pod_uid": POD, "qos": "guaranteed", "runtime": "cri-o"},
    ),
    (
        f"4:memory:/kubepods/burstable/pod{POD}/{CID}\n",
        "kubernetes",
        CID,
        {"pod_uid": POD, "qos": "burstable"},
    ),
    (
        "4:memory:/slurm/uid_1001/job_8812/step_0\n0::/\n",
        "slurm",
        "8812",
        {"uid": "1001", "step": "0"},
    ),
    ("4:memory:/slurm/uid_1001/job_8812/step_batch/task_0\n", "slurm", "8812", {"step": "batch"}),
    # Debian's and Spack's Slurm (MULTIPLE_SLURMD): the v1 root is /slurm_<NodeName>.
    (
        "4:memory:/slurm_gpu-n07/uid_1001/job_8812/step_0/task_0\n",
        "slurm",
        "8812",
        {"uid": "1001", "step": "0"},
    ),
    (
        v2("/system.slice/slurmstepd.scope/job_8812/step_0/user/task_0"),
        "slurm",
        "8812",
        {"step": "0"},
    ),
    (
        v2("/system.slice/node7_slurmstepd.scope/job_77/step_extern"),
        "slurm",
        "77",
        {"step": "extern"},
    ),
    (v2("/system.slice/nvidia-dcgm.service"), "service", "nvidia-dcgm.service", {}),
    (v2("/system.slice/train@3.service"), "service", "train@3.service", {}),
    (
        v2("/user.slice/user-1000.slice/session-42.scope"),
        "session",
        "session-42.scope",
        {"uid": "1000"},
    ),
    (
        v2("/user.slice/user-1000.slice/user@1000.service/app.slice/x.service"),
        "session",
        "user@1000.service",
        {"uid": "1000"},
    ),
    (
        v2(f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope"),
        "podman",
        CID,
        {"uid": "1000", "rootless": "yes"},
    ),
    (v2("/init.scope"), "other", "/init.scope", {}),
    # A hybrid box: the v1 Slurm plugin's path beats the v2 line systemd left at slurmd.
    (
        HYBRID_ROOT.replace("4:memory:/", "4:memory:/slurm/uid_7/job_5/step_0")
        + v2("/system.slice/slurmd.service"),
        "slurm",
        "5",
        {"uid": "7"},
    ),
    (
        HYBRID_ROOT.replace("9:name=systemd:/", f"9:name=systemd:/system.slice/docker-{CID}.scope")
        + v2("/"),
        "docker",
        CID,
        {},
    ),
]


@pytest.mark.parametrize(("text", "kind", "wid", "detail"), SHAPES)
def test_real_shapes(text: str, kind: str, wid: str, detail: dict[str, str]) -> None:
    w = parse_cgroup(text)
    assert w is not None
    assert (w.kind, w.id) == (kind, wid)
    assert detail.items() <= dict(w.detail).items()
    assert w.to_dict()["kind"] == kind


@pytest.mark.parametrize("text", [None, "", "0::/\n", HYBRID_ROOT + "0::/\n"])
def test_root_or_nothing_names_no_workload(text: str | None) -> None:
    assert parse_cgroup(text) is None


# Lookalikes inside a user's own subtree (systemd delegates it: the user may mkdir there) or
# below another prefix are never a root-made container or job.
@pytest.mark.parametrize(
    "path",
    [
        "/user.slice/user-1000.slice/user@1000.service/system.slice/slurmstepd.scope/job_1",
        "/user.slice/user-1000.slice/user@1000.service/slurm/uid_0/job_1/step_0",
        f"/home/system.slice/docker-{CID}.scope",
        f"/system.slice/docker-{CID[:12]}.scope",  # a short id is not docker's
        f"/system.slice/docker-{CID.upper()}.scope",
        "/slurm/uid_x/job_1",
    ],
)
def test_lookalikes_are_not_root_workloads(path: str) -> None:
    w = parse_cgroup(v2(path))
    assert w is not None
    assert w.kind in ("session", "other")
    assert decide_owner(w, {0: "root", 1000: "alice"}, "owner").owner is None


@pytest.mark.parametrize(
    "text",
    [
        # a cgroup name with a newline forging a v2 line after the real one ...
        f"0::/user.slice/user-1000.slice/user@1000.service/x\n0::/system.slice/docker-{CID}.scope\n",
        # ... or a v1 line, on a hybrid box
        "9:name=systemd:/user.slice/user-1000.slice/user@1000.service/x\n"
        "4:memory:/slurm/uid_0/job_1/step_0\n8:pids:/\n0::/\n",
        "4:memory:/x\n4:memory:/slurm/uid_0/job_1\n",  # a hierarchy twice
        "0::/a\n4:memory:/slurm/uid_0/job_1\n",  # after the v2 line
        "garbage\n",
        "1::/slurm/uid_0/job_1\n",  # a v1 line without controllers
    ],
)
def test_a_forged_line_makes_the_whole_file_untrusted(text: str) -> None:
    assert cgroup_paths(text) is None
    w = parse_cgroup(text)
    assert w is not None and w.kind == "other" and w.get("untrusted") == "yes"
    assert "\n" not in w.id and w.owner is None
    assert decide_owner(w, {0: "root"}, "owner").owner is None


@given(st.text(max_size=200))
def test_any_text_parses_without_error_and_prints_clean(text: str) -> None:
    w = parse_cgroup(text)
    if w is not None:
        assert w.id.isprintable() and short_name(w).isprintable()


def container(**detail: str) -> Workload:
    return Workload("docker", CID, name="train-llama").with_detail(**detail)


@pytest.mark.parametrize(
    ("w", "owner"),
    [
        (container(**{"label.owner": "alice"}), "alice"),
        (container(), "root"),  # no label: root's, so a forced kill
        (container(**{"label.owner": "Alice; rm -rf /"}), "root"),  # not a user name
        (container(**{"label.team": "alice"}), "root"),  # another label
        (container(uid="1000", rootless="yes", **{"label.owner": "bob"}), "alice"),
        (Workload("slurm", "8812").with_detail(uid="1001"), "bob"),
        (Workload("slurm", "8812").with_detail(user="bob"), "bob"),
        (Workload("slurm", "8812"), None),
        (Workload("session", "session-1.scope").with_detail(uid="1000"), None),
        (Workload("service", "x.service"), None),
    ],
)
def test_owner_comes_from_what_root_controls(w: Workload, owner: str | None) -> None:
    assert decide_owner(w, {1000: "alice", 1001: "bob"}, "owner").owner == owner


def test_no_owner_label_configured_means_root() -> None:
    assert decide_owner(container(**{"label.owner": "alice"}), {}, None).owner == "root"


@pytest.mark.parametrize(
    ("w", "cmd"),
    [
        (container(), "docker stop train-llama"),
        (Workload("podman", CID), f"podman stop {CID[:12]}"),
        (Workload("docker", CID, name="--rm -f"), f"docker stop {CID[:12]}"),
        (Workload("slurm", "8812"), "scancel 8812"),
        (Workload("service", "train.service"), "systemctl stop train.service"),
        (Workload("session", "session-1.scope"), None),
        (Workload("kubernetes", CID), None),
        (Workload("other", "/x"), None),
        (Workload("docker", CID).with_detail(rootless="yes"), None),
    ],
)
def test_the_command_that_stops_it_for_good(w: Workload, cmd: str | None) -> None:
    assert stop_command(w) == cmd
    assert stop_argv(w) == (cmd.split(" ") if cmd else None)


def test_descriptions_name_what_is_killed() -> None:
    w = container(image="pytorch:24.05")
    w = decide_owner(w.with_detail(**{"label.owner": "alice"}), {}, "owner")
    assert describe(w) == "container `train-llama` (image `pytorch:24.05`) of Linux user `alice`"
    job = Workload("slurm", "8812", name="sweep-lr", owner="bob").with_detail(step="0")
    assert describe(job) == "Slurm job 8812 step 0 (user `bob`, job name `sweep-lr`)"
    assert short_name(job) == "slurm:8812.0"
    assert short_name(container()) == "docker:train-llama"


@pytest.mark.parametrize(
    ("w", "may"),
    [
        (container(restart="always"), True),
        (container(restart="on-failure"), True),
        (container(), True),  # policy unknown (no lookup): watch it
        (container(restart="no"), False),
        (Workload("kubernetes", CID), True),
        (Workload("slurm", "1"), True),
        (Workload("service", "x.service"), True),
        (Workload("session", "session-1.scope"), False),
        (Workload("other", "/x"), False),
        (None, False),
    ],
)
def test_what_may_come_back(w: Workload | None, may: bool) -> None:
    assert may_restart(w) is may
