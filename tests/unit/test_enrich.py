"""Workload names from docker, podman, crictl and scontrol: argv, strict parsing, owners.

The samples keep the shape of each tool's own documented output, trimmed to the fields read:
docker from docker-inspect(1) and the Engine API's "inspect a container" example, podman from
podman-container-inspect(1), crictl from cri-tools' ``outputStatusData`` wrapping a CRI-O
``ContainerStatus`` (as quoted in falcosecurity/libs' CRI tests), scontrol from Slurm's
``_sprint_job_info`` and the sample in UCSF-CBI/c4's docs (``scontrol show jobid 354191``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpubot.core.enrich import apply_enrichment, enrich_argv, enrich_target, parse_enrichment
from gpubot.core.runtimes.base import Found
from gpubot.core.runtimes.docker import parse_docker_inspect
from gpubot.core.runtimes.inspect_json import MAX_LABELS, MAX_TEXT
from gpubot.core.runtimes.kubernetes import parse_crictl_inspect
from gpubot.core.runtimes.podman import parse_podman_inspect
from gpubot.core.runtimes.slurm import SLURM_SCRIPT, parse_scontrol
from gpubot.core.workload import Workload
from tests.fixtures.node_samples import FORGED_USER, job_record

D1 = "d2cc496561d6d520cbc0236b4ba88c362c446a7619992123f11c809cded25b47"  # docker-inspect(1)
D2 = "3949fff2e8dd8d0df1a7419b3f1f99cb0530558df91f627bf8d50e18e9cb5e6c"
P1 = "99f66530fe9c7249f7cf29f78e8661669d5831cbe4ee80ea757d5e922dd6a8a6"  # podman's manual
C1 = "49ecc282021562c567a8159ef424a06cdd8637efdca5953de9794eafe29adcad"  # CRI-O sample
C2 = "13765a70dfbb1b35ebff60c04ddfebf9177715bcf79e67279d4e8128799501bf"
POD = "10f7fc16-c6fc-4a84-b1e1-90c0b99f71c1"


EXAMPLE_LABELS = {
    "com.example.vendor": "Acme",
    "com.example.license": "GPL",
    "com.example.version": "1.0",
}


def docker_obj(
    cid: str = D1, name: str = "/boring_euclid", labels: object = EXAMPLE_LABELS
) -> dict[str, Any]:
    """One container as ``docker inspect`` prints it (Engine API example, trimmed)."""
    return {
        "Id": cid,
        "Created": "2015-06-08T16:18:02.505155285Z",
        "Path": "bash",
        "Args": [],
        "State": {"Running": True, "Pid": 4242, "ExitCode": 0},
        "Image": "sha256:ded7cd95e059788f2586a51c275a4f151653779d6a7f4dad77c2bd34601d94e4",
        "Name": name,
        "RestartCount": 0,
        "HostConfig": {"RestartPolicy": {"MaximumRetryCount": 2, "Name": "on-failure"}},
        "Config": {
            "Hostname": "ba033ac44011",
            "Image": "ubuntu",
            "Labels": labels,
        },
    }


DOCKER_OUT = json.dumps([docker_obj()], indent=4) + "\n"

PODMAN_OUT = """[
    {
        "Id": "PODMAN_ID",
        "Created": "2021-09-16T06:09:08.936623325-04:00",
        "Path": "echo",
        "Args": ["hi"],
        "State": {"OciVersion": "1.0.2-dev", "Status": "exited", "Running": false, "Pid": 0},
        "Image": "14119a10abf4669e8cdbdff324a9f9605d99697215a0d21c360fe8dfa8471bab",
        "ImageName": "docker.io/library/alpine:latest",
        "Pod": "",
        "Name": "foobar",
        "RestartCount": 0,
        "Config": {
            "Hostname": "99f66530fe9c",
            "Image": "docker.io/library/alpine:latest",
            "Labels": null,
            "Annotations": {"io.container.manager": "libpod"}
        },
        "HostConfig": {"RestartPolicy": {"Name": "", "MaximumRetryCount": 0}}
    }
]
""".replace("PODMAN_ID", P1)


def crictl_obj(cid: str = C1, pod_uid: str = "redhat-test-crio") -> dict[str, Any]:
    """One ``{"status": ..., "info": ...}`` object as crictl inspect prints it."""
    return {
        "status": {
            "id": cid,
            "metadata": {"attempt": 0, "name": "redis"},
            "state": "CONTAINER_RUNNING",
            "createdAt": "2023-12-12T04:10:26.159883003Z",
            "image": {"annotations": {}, "image": "quay.io/crio/redis:alpine"},
            "imageRef": "quay.io/crio/redis@sha256:1780b5a5496189974b94eb2595d86731d7a0820e"
            "4beb8ea770974298a943ed55",
            "labels": {
                "io.kubernetes.container.name": "redis",
                "io.kubernetes.pod.name": "podsandbox1",
                "io.kubernetes.pod.namespace": "redhat.test.crio",
                "io.kubernetes.pod.uid": pod_uid,
            },
            "annotations": {"io.kubernetes.container.restartCount": "0"},
            "logPath": "/var/log/crio/pods/x/49ecc2820215.log",
        },
        "info": {"pid": 4242, "sandboxID": "1f04600dc694"},
    }


# --- argv ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("runtime", "ids", "sudo", "want"),
    [
        ("docker", [D1, D2], False, ["docker", "inspect", "--type", "container", D1, D2]),
        ("docker", [D1], True, ["sudo", "-n", "docker", "inspect", "--type", "container", D1]),
        ("podman", [P1], False, ["podman", "inspect", "--type", "container", P1]),
        ("podman", [P1], True, ["sudo", "-n", "podman", "inspect", "--type", "container", P1]),
        ("crictl", [C1, C2], False, ["crictl", "inspect", C1, C2]),
        ("crictl", [C1], True, ["sudo", "-n", "crictl", "inspect", C1]),
        ("docker", [D1, D2, D1], False, ["docker", "inspect", "--type", "container", D1, D2]),
    ],
)
def test_argv_containers(runtime: str, ids: list[str], sudo: bool, want: list[str]) -> None:
    assert enrich_argv(runtime, ids, timeout_s=5, sudo=sudo) == ["timeout", "-k", "1", "5", *want]


@pytest.mark.parametrize("sudo", [False, True])
def test_argv_slurm_is_a_constant_script_never_under_sudo(sudo: bool) -> None:
    argv = enrich_argv("slurm", ["8812", "17"], timeout_s=2.5, sudo=sudo)
    assert argv == [
        "timeout",
        "-k",
        "1",
        "2.5",
        "sh",
        "-c",
        SLURM_SCRIPT,
        "gpubot-scontrol",
        "8812",
        "17",
    ]
    assert "sudo" not in argv


@pytest.mark.parametrize(
    ("runtime", "bad"),
    [
        ("docker", D1.upper()),
        ("docker", D1[:12]),  # a short id could match a prefix of someone else's
        ("docker", D1 + "0"),
        ("docker", "--help"),
        ("docker", f"{D1} {D2}"),
        ("podman", "$(reboot)"),
        ("crictl", ""),
        ("crictl", D1[:-1] + "g"),
        ("slurm", "12a"),
        ("slurm", "-1"),
        ("slurm", "8812;reboot"),
        ("slurm", "12345678901"),
        ("slurm", D1),
        ("slurm", "８８１２"),  # fullwidth digits
        ("docker", "8812"),
    ],
)
def test_argv_refuses_bad_ids(runtime: str, bad: str) -> None:
    with pytest.raises(ValueError):
        enrich_argv(runtime, [D1 if runtime != "slurm" else "1", bad], timeout_s=5, sudo=False)


@pytest.mark.parametrize(
    ("runtime", "ids", "timeout_s"),
    [
        ("docker", [], 5.0),
        ("crictl", [], 5.0),
        ("lxc", [D1], 5.0),
        ("docker", [D1], 0.0),
        ("docker", [D1], -1.0),
        ("slurm", ["1"], float("nan")),
        ("slurm", ["1"], float("inf")),
    ],
)
def test_argv_refuses_bad_calls(runtime: str, ids: list[str], timeout_s: float) -> None:
    with pytest.raises(ValueError):
        enrich_argv(runtime, ids, timeout_s=timeout_s, sudo=False)


@pytest.mark.parametrize(
    ("w", "want"),
    [
        (Workload("docker", D1), ("docker", D1)),
        (Workload("podman", P1), ("podman", P1)),
        (Workload("podman", P1).with_detail(rootless="yes", uid="1001"), None),
        (
            Workload("kubernetes", C1).with_detail(container_id=C1, pod_uid=POD),
            ("crictl", C1),
        ),
        (Workload("kubernetes", POD).with_detail(pod_uid=POD), None),
        (Workload("slurm", "8812").with_detail(step="0"), ("slurm", "8812")),
        (Workload("service", "ollama.service"), None),
        (Workload("other", "/weird"), None),
    ],
)
def test_enrich_target(w: Workload, want: tuple[str, str] | None) -> None:
    assert enrich_target(w) == want


# --- docker / podman ----------------------------------------------------------------------------


def test_docker_sample() -> None:
    assert parse_docker_inspect(DOCKER_OUT, [D1]) == {
        D1: Found(
            name="boring_euclid",
            image="ubuntu",
            restart="on-failure",
            labels=(
                ("com.example.license", "GPL"),
                ("com.example.vendor", "Acme"),
                ("com.example.version", "1.0"),
            ),
        )
    }
    assert parse_enrichment("docker", DOCKER_OUT, [D1]) == parse_docker_inspect(DOCKER_OUT, [D1])


def test_podman_sample_null_labels_and_empty_restart() -> None:
    assert parse_podman_inspect(PODMAN_OUT, [P1]) == {
        P1: Found(name="foobar", image="docker.io/library/alpine:latest")
    }


def _docker(*objs: dict[str, Any]) -> str:
    return json.dumps(list(objs), indent=4) + "\n"


@pytest.mark.parametrize(
    ("stdout", "ids", "want"),
    [
        # docker exits 1 for the id it cannot find but still prints the others
        (_docker(docker_obj(D1)), [D1, D2], {D1}),
        (_docker(docker_obj(D1), docker_obj(D2, "/two")), [D1, D2], {D1, D2}),
        (_docker(docker_obj(D1), docker_obj(D2)), [D2], {D2}),  # not asked: ignored
        (_docker(docker_obj(D1), docker_obj(D1, "/evil")), [D1], set()),  # twice: dropped
        (_docker(docker_obj(D1), docker_obj(D1), docker_obj(D2)), [D1, D2], {D2}),
        (_docker(docker_obj(D1[:12])), [D1], set()),  # a short id is not the id
        (_docker({**docker_obj(D1), "Id": None}), [D1], set()),
        ("[]\n", [D1], set()),
        ("", [D1], set()),
        ("Error: No such object: " + D1 + "\n", [D1], set()),
        (DOCKER_OUT[: len(DOCKER_OUT) // 2], [D1], set()),  # cut short
        ("null\n", [D1], set()),
        ('["x", 3, null]', [D1], set()),
        ("[" * 100_000, [D1], set()),
        (DOCKER_OUT, ["not-an-id"], set()),
    ],
)
def test_docker_partial_and_bad_output(stdout: str, ids: list[str], want: set[str]) -> None:
    assert set(parse_docker_inspect(stdout, ids)) == want


@pytest.mark.parametrize(
    ("labels", "want"),
    [
        (None, ()),
        ({}, ()),
        ([], ()),
        ({"a": 1, "b": None, "c": "ok"}, (("c", "ok"),)),
        ({"x\ny": "v\u202e"}, (("x\\x0ay", "v\\x202e"),)),
        ({"k" * (MAX_TEXT + 1): "dropped", "k": "v" * 500}, (("k", "v" * (MAX_TEXT - 1) + "…"),)),
    ],
)
def test_docker_labels(labels: object, want: tuple[tuple[str, str], ...]) -> None:
    found = parse_docker_inspect(_docker(docker_obj(D1, labels=labels)), [D1])[D1]
    assert found.labels == want


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("/train-llama", "train-llama"),
        ("train", "train"),  # no slash: kept whole
        ("//x", "/x"),
        ("/a\nb\x1b[31m", "a\\x0ab\\x1b[31m"),
        ("/" + "n" * 1000, "n" * (MAX_TEXT - 1) + "…"),
        ("/", None),
        ("", None),
    ],
)
def test_docker_names_are_marked_and_bounded(name: str, want: str | None) -> None:
    assert parse_docker_inspect(_docker(docker_obj(D1, name)), [D1])[D1].name == want


# --- crictl -------------------------------------------------------------------------------------


def test_crictl_one_object() -> None:
    out = json.dumps(crictl_obj(), indent=2) + "\n"
    assert parse_crictl_inspect(out, [C1]) == {
        C1: Found(
            name="redis",
            image="quay.io/crio/redis:alpine",
            labels=(
                ("io.kubernetes.container.name", "redis"),
                ("io.kubernetes.pod.name", "podsandbox1"),
                ("io.kubernetes.pod.namespace", "redhat.test.crio"),
                ("io.kubernetes.pod.uid", "redhat-test-crio"),
            ),
            namespace="redhat.test.crio",
            pod="podsandbox1",
            pod_uid="redhat-test-crio",
        )
    }


@pytest.mark.parametrize(
    ("stdout", "want"),
    [
        (json.dumps([crictl_obj(C1), crictl_obj(C2)], indent=2), {C1, C2}),  # current crictl
        (json.dumps(crictl_obj(C1), indent=2) + "\n" + json.dumps(crictl_obj(C2)), {C1, C2}),
        (json.dumps(crictl_obj(C1)) + '\n{"status": {"id"', {C1}),  # cut in the second
        (json.dumps([crictl_obj(C1), crictl_obj(C1)]), set()),
        ("", set()),  # a missing id: current crictl prints nothing at all
        ("E0101 00:00:00 remote_runtime.go: ContainerStatus failed", set()),
        (json.dumps({"status": None}), set()),
        (json.dumps([{"status": {"id": C2}}, crictl_obj(C1)]), {C1, C2}),
    ],
)
def test_crictl_batches(stdout: str, want: set[str]) -> None:
    assert set(parse_crictl_inspect(stdout, [C1, C2])) == want


def test_crictl_missing_fields_are_none() -> None:
    assert parse_crictl_inspect(json.dumps({"status": {"id": C1}}), [C1]) == {C1: Found()}


# --- scontrol -----------------------------------------------------------------------------------


def framed(parts: dict[str, str]) -> str:
    """What ``SLURM_SCRIPT`` prints for ``parts`` (job id -> scontrol's output)."""
    body = "".join(f"\n@gpubot-job {j}\n{o.rstrip(chr(10))}\n" for j, o in parts.items())
    return body + "\n@gpubot-end\n"


def test_scontrol_sample() -> None:
    out = framed({"354191": job_record("354191")})
    assert parse_scontrol(out, ["354191"]) == {
        "354191": Found(name="hi-there.sh", user="alice", uid=30000, state="RUNNING")
    }
    assert parse_enrichment("slurm", out, ["354191"]) == parse_scontrol(out, ["354191"])


def test_scontrol_job_names_keep_spaces_and_equals() -> None:
    out = framed({"8812": job_record("8812", "sweep lr=3e-4 JobState=X")})
    assert parse_scontrol(out, ["8812"])["8812"].name == "sweep lr=3e-4 JobState=X"


def test_scontrol_array_and_het_jobs() -> None:
    array = (
        job_record("8812", "a", first="ArrayJobId=8812 ArrayTaskId=0 ")
        + job_record("8813", "a", first="ArrayJobId=8812 ArrayTaskId=1 ArrayTaskThrottle=2 ")
        + job_record("8814", "a", first="ArrayJobId=8812 ArrayTaskId=2-9%2 ")
    )
    het = job_record("90", "h", first="HetJobId=90 HetJobOffset=0 ") + job_record(
        "91", "h", first="HetJobId=90 HetJobOffset=1 "
    )
    found = parse_scontrol(framed({"8812": array, "90": het}), ["8812", "90"])
    assert set(found) == {"8812", "90"}
    assert {f.user for f in found.values()} == {"alice"}


def test_scontrol_gone_jobs_and_duplicates() -> None:
    out = framed({"1": job_record("1"), "2": "", "3": job_record("3") + job_record("3")})
    assert set(parse_scontrol(out, ["1", "2", "3"])) == {"1"}
    assert set(parse_scontrol(framed({"1": job_record("1")}), ["1", "1", "x"])) == {"1"}


@pytest.mark.parametrize(
    ("user", "uid", "want_user"),
    [
        ("alice", 30000, "alice"),
        ("nobody", 30000, None),
        ("nobody", 65534, "nobody"),
        ("Alice", 30000, None),
        ("a\\x0a", 1, None),
        ("bob$", 1001, "bob$"),
    ],
)
def test_scontrol_user_names(user: str, uid: int, want_user: str | None) -> None:
    found = parse_scontrol(framed({"5": job_record("5", user=user, uid=uid)}), ["5"])["5"]
    assert (found.user, found.uid) == (want_user, uid)


@pytest.mark.parametrize(
    ("parts", "want"),
    [
        # a second UserId token on the name's own line, or a whole forged line
        ({"8812": job_record("8812", "x UserId=root(0)")}, {}),
        ({"8812": job_record("8812", "x\n" + FORGED_USER)}, {}),
        ({"8812": job_record("8812", comment="c\n" + FORGED_USER)}, {}),
        ({"8812": job_record("8812", workdir="/tmp/\n" + FORGED_USER + "\n")}, {}),
        # split the record so the real UserId line falls into a forged one: users differ
        ({"8812": job_record("8812", f"x\n{FORGED_USER}\nJobId=7 JobName=y")}, {}),
        (
            {
                "8812": job_record(
                    "8812", f"x\n{FORGED_USER}\nJobId=7 ArrayJobId=8812 ArrayTaskId=1 JobName=y"
                )
            },
            {},
        ),
        # a forged record for another asked job whose real record is gone
        (
            {"8812": job_record("8812", f"x\n\nJobId=8813 JobName=y\n{FORGED_USER}\n"), "8813": ""},
            {},
        ),
        # a forged record for another asked job that does exist: that job keeps its own
        (
            {
                "8812": job_record("8812", f"x\n\nJobId=8813 JobName=y\n{FORGED_USER}\n"),
                "8813": job_record("8813", user="carol", uid=1003),
            },
            {"8813": "carol"},
        ),
        # forged markers: the framing no longer holds, nothing is trusted
        ({"8812": job_record("8812", "x\n@gpubot-job 8813"), "8813": job_record("8813")}, {}),
        ({"8812": job_record("8812", "x\n@gpubot-end")}, {}),
        ({"8812": job_record("8812", "x\nJobId=oops")}, {}),
        ({"8812": job_record("8812", "x\nJobId=8812 JobName=again\n" + FORGED_USER)}, {}),
        ({"8812": job_record("8812", "x\u2028   UserId=root(0) GroupId=root(0)")}, {}),
        ({"8812": job_record("8812", "x\u00a0UserId=root(0)")}, {}),
        # harmless lookalikes
        ({"8812": job_record("8812", "xUserId=root(0)")}, {"8812": "alice"}),
        ({"8812": job_record("8812", "x\n   JobState=COMPLETED")}, {"8812": "alice"}),
    ],
)
def test_scontrol_forgeries(parts: dict[str, str], want: dict[str, str]) -> None:
    found = parse_scontrol(framed(parts), list(parts))
    assert {k: v.user for k, v in found.items()} == want


def test_scontrol_forged_state_is_not_taken() -> None:
    out = framed({"8812": job_record("8812", "x\n   JobState=COMPLETED")})
    assert parse_scontrol(out, ["8812"])["8812"].state is None


@pytest.mark.parametrize(
    "stdout",
    [
        "",
        "sh: 1: scontrol: not found\n",
        framed({"1": job_record("1")}).replace("@gpubot-end", ""),  # cut short
        framed({"1": job_record("1")})[:-30],
        job_record("1"),  # no markers: not this script's output
        framed({"2": job_record("2")}),  # markers for other jobs
    ],
)
def test_scontrol_bad_framing(stdout: str) -> None:
    assert parse_scontrol(stdout, ["1"]) == {}


def test_scontrol_name_is_marked() -> None:
    out = framed({"1": job_record("1", "a\x1b]0;pwned\x07\u202e" + "n" * 400)})
    name = parse_scontrol(out, ["1"])["1"].name
    assert name is not None and name.isprintable() and len(name) == MAX_TEXT
    assert name.startswith("a\\x1b]0;pwned\\x07\\x202e")


# --- hypothesis ---------------------------------------------------------------------------------

JOBS = ["8812", "8813", "8814"]
USERS = {"8812": ("alice", 30000), "8813": ("bob", 1001), "8814": ("carol", 1003)}
# Whole forged lines, so that hypothesis composes real attacks (a forged record, a split record,
# forged markers) rather than mostly noise; and character noise between them.
FORGED_LINES = [
    FORGED_USER,
    "   UserId=carol(1003) GroupId=carol(1003) MCS_label=N/A",
    "JobId=7 JobName=y",
    "JobId=8813 JobName=y",
    "JobId=8814 ArrayJobId=8812 ArrayTaskId=1 JobName=y",
    "@gpubot-job 8813",
    "@gpubot-job 8814",
    "@gpubot-end",
    "",
    "   JobState=COMPLETED",
]
noise = st.text(alphabet="aZ9 =()\t\u2028", max_size=3)
hostile = st.lists(
    st.one_of(st.sampled_from(FORGED_LINES).map(lambda line: "\n" + line), noise), max_size=6
).map("".join)


@settings(max_examples=500, deadline=None)
@given(
    present=st.lists(st.booleans(), min_size=3, max_size=3),
    names=st.lists(hostile, min_size=3, max_size=3),
    comments=st.lists(hostile, min_size=3, max_size=3),
    workdirs=st.lists(hostile, min_size=3, max_size=3),
)
def test_hostile_text_never_changes_whose_job_it_is(
    present: list[bool], names: list[str], comments: list[str], workdirs: list[str]
) -> None:
    parts = {}
    for job, here, name, comment, wd in zip(JOBS, present, names, comments, workdirs, strict=True):
        user, uid = USERS[job]
        parts[job] = (
            job_record(job, name, user, uid, comment=comment, workdir="/w" + wd) if here else ""
        )
    for job, found in parse_scontrol(framed(parts), JOBS).items():
        assert parts[job], f"{job} is gone from Slurm yet was named"
        assert (found.user, found.uid) == USERS[job]


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_parsers_never_raise(data: st.DataObject) -> None:
    base = data.draw(
        st.sampled_from(
            [DOCKER_OUT, PODMAN_OUT, json.dumps([crictl_obj()]), framed({"1": job_record("1")})]
        )
    )
    at = data.draw(st.integers(0, len(base)))
    cut = data.draw(st.integers(0, 40))
    noise = data.draw(st.text(max_size=40))
    text = base[:at] + noise + base[at + cut :]
    for parse in (parse_docker_inspect, parse_podman_inspect, parse_crictl_inspect):
        assert isinstance(parse(text, [D1, P1, C1]), dict)
    assert isinstance(parse_scontrol(text, ["1"]), dict)


# --- onto workloads: names and owners -----------------------------------------------------------

OWNER = "gpubot.owner"


def _labelled(**labels: str) -> Found:
    return Found(
        name="train-llama",
        image="nvcr.io/nvidia/pytorch:24.01-py3",
        restart="always",
        labels=tuple(sorted(labels.items())),
    )


@pytest.mark.parametrize(
    ("w", "found", "owner"),
    [
        (Workload("docker", D1), _labelled(**{OWNER: "alice"}), "alice"),
        (Workload("docker", D1), _labelled(), "root"),
        (Workload("docker", D1), _labelled(**{OWNER: "Alice Smith"}), "root"),
        (Workload("docker", D1), _labelled(**{OWNER: "a\\x0aroot"}), "root"),
        (Workload("docker", D1), _labelled(other="alice"), "root"),
        (Workload("docker", D1), None, "root"),
        # rootless: the user slice decides, whatever the label says
        (
            Workload("podman", P1).with_detail(rootless="yes", uid="1001"),
            _labelled(**{OWNER: "alice"}),
            "bob",
        ),
        (Workload("podman", P1).with_detail(rootless="yes", uid="1001"), None, "bob"),
        # Slurm: scontrol's user (v2 cgroup paths carry no uid)
        (Workload("slurm", "8812"), Found(name="j", user="carol", uid=1003), "carol"),
        (Workload("slurm", "8812"), Found(name="j", user=None, uid=1001), "bob"),
        (
            Workload("slurm", "8812").with_detail(uid="1001"),
            Found(name="j", user="bob", uid=1001),
            "bob",
        ),
        # scontrol names another uid than root's cgroup path: not believed
        (
            Workload("slurm", "8812").with_detail(uid="1001"),
            Found(name="j", user="root", uid=0),
            "bob",
        ),
        (Workload("slurm", "8812"), None, None),
        (Workload("service", "ollama.service"), _labelled(**{OWNER: "alice"}), None),
    ],
)
def test_owner_decisions(w: Workload, found: Found | None, owner: str | None) -> None:
    assert apply_enrichment(w, found, OWNER, {1001: "bob", 0: "root"}).owner == owner


def test_container_details() -> None:
    w = apply_enrichment(Workload("docker", D1), _labelled(**{OWNER: "alice"}), OWNER)
    assert w.name == "train-llama"
    assert dict(w.detail) == {
        "image": "nvcr.io/nvidia/pytorch:24.01-py3",
        "restart": "always",
        f"label.{OWNER}": "alice",
    }


def test_labels_are_bounded_but_the_owner_label_kept() -> None:
    many = {f"a{i:03}": "x" for i in range(300)} | {"zzz.owner": "alice"}
    w = apply_enrichment(Workload("docker", D1), _labelled(**many), "zzz.owner")
    labels = [k for k, _ in w.detail if k.startswith("label.")]
    assert len(labels) == MAX_LABELS + 1 and "label.zzz.owner" in labels
    assert w.owner == "alice"


def test_unknown_names_say_so() -> None:
    w = apply_enrichment(Workload("docker", D1), None, OWNER)
    assert (w.kind, w.id, w.name, w.get("name_unknown")) == ("docker", D1, None, "yes")
    s = apply_enrichment(
        Workload("slurm", "8812").with_detail(uid="1001"),
        Found(name="j", user="root", uid=0),
        OWNER,
        {1001: "bob"},
    )
    assert (s.name, s.get("name_unknown"), s.get("uid")) == (None, "yes", "1001")


def test_slurm_details() -> None:
    w = apply_enrichment(
        Workload("slurm", "8812").with_detail(step="0"),
        Found(name="sweep-lr", user="bob", uid=1001, state="RUNNING"),
        OWNER,
    )
    assert (w.name, w.owner, w.get("uid"), w.get("state"), w.get("step")) == (
        "sweep-lr",
        "bob",
        "1001",
        "RUNNING",
        "0",
    )


def test_kubernetes_details_and_pod_mismatch() -> None:
    w = Workload("kubernetes", C1).with_detail(container_id=C1, pod_uid=POD)
    found = parse_crictl_inspect(json.dumps(crictl_obj(C1, POD)), [C1])[C1]
    got = apply_enrichment(w, found, OWNER)
    assert got.name == "redhat.test.crio/podsandbox1"
    assert (got.get("namespace"), got.get("pod"), got.get("container"), got.owner) == (
        "redhat.test.crio",
        "podsandbox1",
        "redis",
        "root",
    )
    other = parse_crictl_inspect(json.dumps(crictl_obj(C1, "another-pod")), [C1])[C1]
    assert apply_enrichment(w, other, OWNER).get("name_unknown") == "yes"
