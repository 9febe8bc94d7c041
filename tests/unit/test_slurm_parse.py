"""Slurm's JSON about a node, every version: real answers (tests/corpus/slurm/, sources in its
README.md) with the answer hand-checked against each, the shapes Slurm's source documents for
the versions with no public recording (v0.0.38, v0.0.39), and hostile input."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpubot.core.slurm import GresMap, JobAlloc, NodeState
from gpubot.core.slurm.gresconf import gres_map
from gpubot.core.slurm.parse import (
    SlurmParseError,
    expand_hostlist,
    gpu_indices,
    jobs_on,
    node_state,
    openapi_versions,
    pick_version,
)

SLURM = Path(__file__).resolve().parent.parent / "corpus" / "slurm"


def load(name: str) -> Any:
    return json.loads((SLURM / name).read_text(encoding="utf-8"))


def test_the_corpus_is_listed_whole_with_its_sources() -> None:
    readme = (SLURM / "README.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| (\S+\.json) \| ([HP] tests/assets/slurmrestd/\S+)", readme, re.M))
    assert set(rows) == {p.name for p in SLURM.glob("*.json")} and len(rows) >= 14


def _ids(jobs: tuple[JobAlloc, ...]) -> dict[str, tuple[int, ...]]:
    assert not any(j.gpu_unknown for j in jobs)
    return {j.job_id: j.gpu_idx for j in jobs}


@pytest.mark.parametrize(
    ("file", "node", "want"),
    [
        ("v0.0.40-job-gpus-multi-types.json", "ia2", {"796": (0, 2)}),
        ("v0.0.40-job-gpus-multi-types.json", "ia1", {}),
        ("v0.0.40-job-gpus-per-node.json", "ia1", {"795": (0,)}),
        ("v0.0.40-job-gpus-per-node.json", "ia2", {"795": (0,)}),
        ("v0.0.40-job-gpus-multi-nodes.json", "ia1", {"793": (0, 1, 2, 3, 4, 5)}),
        ("v0.0.41-job-gpus-multi-nodes.json", "gpu2", {"5981": (0, 1, 2, 3)}),
        ("v0.0.43-job-gpus-per-node.json", "gpu1", {"4744": (0,)}),
        ("v0.0.44-job-gpus-running.json", "gpu2", {"5557": (0, 1, 2, 3)}),
        ("v0.0.44-job-gpus-running.json", "gpu1", {}),
        ("v0.0.42-jobs.json", "cn1", {"6360": (), "6364": (), "6365": ()}),
        ("v0.0.42-jobs.json", "cn3", {"6363": (), "6365": (), "6366": (), "6368": ()}),
        ("v0.0.42-jobs.json", "cn", {}),
    ],
)
def test_recorded_jobs(file: str, node: str, want: dict[str, tuple[int, ...]]) -> None:
    assert _ids(jobs_on(load(file), node)) == want


def test_a_recorded_job_in_full() -> None:
    (job,) = jobs_on(load("v0.0.41-job-gpus-multi-nodes.json"), "gpu1")
    assert job == JobAlloc(
        job_id="5981",
        user="emendoza",
        name="wrap",
        state="RUNNING",
        gpu_idx=(0, 1, 2, 3),
        account="biology",
        start=1747752261.0,
        end=1747752321.0,
    )


@pytest.mark.parametrize(
    ("file", "node", "want"),
    [
        (
            "v0.0.40-node-drain.json",
            "cn1",
            NodeState("cn1", ("IDLE", "DRAIN"), "ECC memory error", "root", 1746621136.0),
        ),
        (
            "v0.0.41-node-draining.json",
            "cn1",
            NodeState("cn1", ("MIXED", "DRAIN"), "ECC memory error", "root", 1762858462.0),
        ),
        (
            "v0.0.41-nodes.json",
            "cn4",
            NodeState("cn4", ("IDLE", "DRAIN"), "ECC memory error", "slurm", 1763370733.0),
        ),
        (
            "v0.0.41-nodes.json",
            "cn1",
            NodeState("cn1", ("DOWN",), "CPU dead", "slurm", 1763370733.0),
        ),
        ("v0.0.41-nodes.json", "ia1", NodeState("ia1", ("IDLE",))),
        ("v0.0.41-nodes.json", "gpu1", None),
        ("v0.0.42-node-with-gpus-model-allocated.json", "ia1", NodeState("ia1", ("ALLOCATED",))),
        ("v0.0.40-node-with-gpus-mixed.json", "ia1", NodeState("ia1", ("ALLOCATED",))),
        (
            "v0.0.44-node-drain.json",
            "cn2",
            NodeState("cn2", ("IDLE", "DRAIN"), "ECC memory error", "root", 1762942585.0),
        ),
        ("v0.0.44-node-unfound.json", "unexisting-node", None),
    ],
)
def test_recorded_nodes(file: str, node: str, want: NodeState | None) -> None:
    got = node_state(load(file), node)
    assert got == want
    assert got is None or got.drained == ("DRAIN" in got.states or "DOWN" in got.states)


def test_an_error_for_another_node_is_not_an_unknown_node() -> None:
    with pytest.raises(SlurmParseError, match="no 'nodes' list: Failure to query node"):
        node_state(load("v0.0.44-node-unfound.json"), "cn1")


def test_recorded_openapi_documents() -> None:
    assert openapi_versions(load("openapi-24.11.json")) == ["v0.0.40", "v0.0.41", "v0.0.42"]
    v = openapi_versions(load("openapi-25.11.json"))
    assert v == ["v0.0.41", "v0.0.42", "v0.0.43", "v0.0.44"] and pick_version(v) == "v0.0.44"


def test_pick_version_takes_the_highest_known() -> None:
    assert pick_version(["v0.0.38", "v0.0.40", "v0.0.99"]) == "v0.0.40"
    assert pick_version(["v0.0.99", "v0.0.10"]) is None and pick_version([]) is None
    doc: dict[str, Any] = {
        "paths": {"/slurm/v0.0.9/ping/": {}, "/slurm/v0.0.10/ping/": {}, "/x": {}, 3: {}}
    }
    assert openapi_versions(doc) == ["v0.0.9", "v0.0.10"]  # by number, not by text
    with pytest.raises(SlurmParseError):
        openapi_versions({"openapi": "3.0"})


# --- shapes from Slurm's source (no public recording found) ---------------------------------


def v38_job(**over: Any) -> dict[str, Any]:
    """The fields of a v0.0.38 job (SchedMD/slurm src/plugins/openapi/v0.0.38/jobs.c @22.05)."""
    job: dict[str, Any] = {
        "account": "ml",
        "array_job_id": 0,
        "array_task_id": None,
        "end_time": 1700003600,
        "gres_detail": ["gpu:a100:2(IDX:1,3)"],
        "het_job_id": 0,
        "het_job_offset": 0,
        "job_id": 42,
        "job_resources": {"nodes": "g[1-2]", "allocated_nodes": [{"memory": 1}, {"memory": 1}]},
        "job_state": "RUNNING",
        "name": "train",
        "nodes": "g[1-2]",
        "start_time": 1700000000,
        "time_limit": 60,
        "user_id": 1000,
        "user_name": "ada",
    }
    job["gres_detail"] = ["gpu:a100:2(IDX:1,3)", "gpu:a100:1(IDX:0)"]
    job.update(over)
    return job


def test_v38_job_and_node_shapes() -> None:
    (job,) = jobs_on({"jobs": [v38_job()]}, "g2")
    assert (job.job_id, job.gpu_idx, job.end, job.user) == ("42", (0,), 1700003600.0, "ada")
    (job,) = jobs_on({"jobs": [v38_job(time_limit=None)]}, "g1")  # INFINITE: null
    assert (job.gpu_idx, job.end) == ((1, 3), None)
    node: dict[str, Any] = {
        "name": "g1",
        "state": "idle",
        "state_flags": ["DRAIN"],
        "reason": "bad ECC",
    }
    node |= {"reason_set_by_user": "root", "reason_changed_at": 1700000000}
    assert node_state({"nodes": [node]}, "g1") == NodeState(
        "g1", ("IDLE", "DRAIN"), "bad ECC", "root", 1700000000.0
    )


def test_v39_job_shape() -> None:
    # 23.02 (v0.0.39): set/number objects, plain times, job_state still a string.
    job = v38_job(array_job_id={"set": True, "infinite": False, "number": 0})
    job |= {"array_task_id": {"set": False, "infinite": False, "number": 0}}
    job |= {"time_limit": {"set": True, "infinite": False, "number": 6000}}
    assert _ids(jobs_on({"jobs": [job]}, "g1")) == {"42": (1, 3)}


def test_array_and_het_ids_and_states() -> None:
    n = {"set": True, "infinite": False, "number": 0}
    arr = v38_job(array_job_id=n | {"number": 40}, array_task_id=n | {"number": 7})
    het = v38_job(job_id=43, het_job_id=n | {"number": 41}, het_job_offset=n | {"number": 1})
    completing = v38_job(job_id=44, job_state=["COMPLETED", "COMPLETING"])
    pending = v38_job(job_id=45, job_state=["PENDING"])
    suspended = v38_job(job_id=46, job_state="SUSPENDED")
    got = jobs_on({"jobs": [arr, het, completing, pending, suspended]}, "g1")
    assert [(j.job_id, j.state) for j in got] == [
        ("40_7", "RUNNING"),
        ("41+1", "RUNNING"),
        ("44", "COMPLETING"),
        ("46", "SUSPENDED"),
    ]
    # each matched to its processes by its own id, what slurmstepd names its cgroup by
    own = str(arr["job_id"])
    assert [j.cgroup_id for j in got] == [own, "43", "44", "46"] and own != "40"


# --- hostlists -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hostlist", "want"),
    [
        ("node[1-3,7],gpu-a[01-02]", ["node1", "node2", "node3", "node7", "gpu-a01", "gpu-a02"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("single", ["single"]),
        ("a,b", ["a", "b"]),
        ("", []),
    ],
)
def test_expand_hostlist(hostlist: str, want: list[str]) -> None:
    assert expand_hostlist(hostlist) == want


@pytest.mark.parametrize(
    "bad", ["n[1-", "n1-3]", "n[3-1]", "n[a-b]", "a,,b", "n[]", "a b", "n\x1b[1]", "n[0-99999999]"]
)
def test_expand_hostlist_refuses(bad: str) -> None:
    with pytest.raises(SlurmParseError) as e:
        expand_hostlist(bad)
    assert "\n" not in str(e.value) and "\x1b" not in str(e.value)


# --- gres_detail forms ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("detail", "want"),
    [
        ("gpu:2(IDX:0-1)", (0, 1)),
        ("gpu:a100:2(IDX:0,3)", (0, 3)),
        ("gpu(IDX:0-1)", (0, 1)),
        ("gpu:tesla:1(IDX:2),mps:100(0)", None),  # MPS clients share GPU 0: its GPUs unsure
        ("gpu:h100:1(IDX:0),gpu:h200:0(IDX:)", (0,)),
        ("shard:2(1/4,1/4),gpu:1(IDX:5)", None),  # shards of GPUs its holders run on
        ("mps:100(0)", None),
        ("", ()),
        ("gpu:2(IDX:N/A)", None),
        ("gpu(CNT:2)", None),
        ("gpu:a100:3(IDX:0-1,4000)", None),  # count 3 for 2 indices, and past the cap
        ("gpu:3(IDX:0-1)", None),
        ("gpu:2(IDX:0-1", None),
        ("gpu:4(IDX:0-1,...)", None),  # bit_fmt cut short
        ("gpu:1(IDX:0)\n", None),
        ("gpu:1:2:3(IDX:0)", None),
    ],
)
def test_gpu_indices(detail: str, want: tuple[int, ...] | None) -> None:
    assert gpu_indices(detail) == want


def test_an_unreadable_entry_is_unknown_never_guessed() -> None:
    for detail in (["gpu:2(IDX:N/A)", "gpu:1(IDX:0)"], ["gpu:1(IDX:0)"], "gpu:1(IDX:0)", [3, 4]):
        (job,) = jobs_on({"jobs": [v38_job(gres_detail=detail)]}, "g1")
        assert job.gpu_unknown and job.gpu_idx == ()
    # No gres_detail, but the job's TRES name gpus: unknown; without gpus: none, known.
    nones: tuple[list[str] | None, ...] = ([], None)
    for none in nones:
        (job,) = jobs_on({"jobs": [v38_job(gres_detail=none, tres_alloc_str="gres/gpu=2")]}, "g1")
        assert job.gpu_unknown
    (job,) = jobs_on({"jobs": [v38_job(gres_detail=[], tres_alloc_str="cpu=1")]}, "g1")
    assert not job.gpu_unknown and job.gpu_idx == ()


def test_node_orders_that_disagree_make_the_indices_unknown() -> None:
    res = {"nodes": {"allocation": [{"index": 0, "name": "g2"}, {"index": 1, "name": "g1"}]}}
    (job,) = jobs_on({"jobs": [v38_job(job_resources=res)]}, "g1")
    assert job.gpu_unknown
    res["nodes"]["allocation"].reverse()  # control: the same order as `nodes`
    (job,) = jobs_on({"jobs": [v38_job(job_resources=res)]}, "g1")
    assert (job.gpu_unknown, job.gpu_idx) == (False, (1, 3))


# --- hostile input -------------------------------------------------------------------------


def test_hostile_jobs_are_skipped_or_escaped() -> None:
    forged = v38_job(job_id=50, name="x gpu:4(IDX:0-3)\n\x1b[31m", user_name="ev\til")
    records: list[Any] = [
        "not a record",
        v38_job(job_id="12a"),
        v38_job(job_id=True),
        v38_job(job_id=2**40),
        v38_job(job_id=-1),
        v38_job(job_state=7),
        v38_job(job_state="running\n"),
        v38_job(nodes=["g1"]),
        v38_job(nodes="g[1-"),
        v38_job(start_time=10**30, end_time="soon", account=["a"]),
        forged,
        v38_job(job_id=50, name="duplicate id"),
    ]
    got = jobs_on({"jobs": records}, "g1")
    assert [j.job_id for j in got] == ["42", "50"]
    assert (got[0].start, got[0].end, got[0].account) == (None, None, None)
    assert got[1].gpu_idx == (1, 3)  # from gres_detail, never from the name
    assert got[1].name == "x gpu:4(IDX:0-3)\\x0a\\x1b[31m" and got[1].user == "ev\\x09il"


@pytest.mark.parametrize(
    "doc", [None, [], "jobs", {"jobs": "x"}, {"errors": [{"description": "Access denied"}]}]
)
def test_a_document_of_another_shape_raises_one_line(doc: Any) -> None:
    with pytest.raises(SlurmParseError) as e:
        jobs_on(doc, "g1")
    assert "\n" not in str(e.value)


def test_an_empty_answer_with_an_error_is_not_no_jobs() -> None:
    err = {"jobs": [], "errors": [{"description": "Unable to query\njobs"}]}
    with pytest.raises(SlurmParseError, match=r"Unable to query\\x0ajobs"):
        jobs_on(err, "g1")
    assert jobs_on({"jobs": [], "errors": []}, "g1") == ()  # control


def test_hostile_nodes() -> None:
    good = {"name": "g1", "state": ["IDLE", "DRAIN"], "reason": "r\x07", "reason_changed_at": 0}
    assert node_state({"nodes": [good]}, "g1") == NodeState("g1", ("IDLE", "DRAIN"), "r\\x07")
    for bad in ({"name": "g1", "state": 3}, {"name": "g1", "state": ["idle", "bad state"]}):
        assert node_state({"nodes": ["x", {"name": 5}, bad]}, "g1") is None
    with pytest.raises(SlurmParseError, match="2 records"):
        node_state({"nodes": [good, good]}, "g1")
    with pytest.raises(SlurmParseError):
        node_state({"nodes": {"g1": good}}, "g1")


# --- gres.conf -----------------------------------------------------------------------------


def test_gres_conf_with_files_is_proven_in_file_order() -> None:
    conf = """# two types, written out of minor order
AutoDetect=off
NodeName=g[1-4] Name=gpu Type=a100 File=/dev/nvidia[2-3]  # comment
NodeName=g[1-4] Name=gpu Type=v100 \\
    File=/dev/nvidia0,/dev/nvidia1 Count=2
NodeName=g[1-4] Name=mps Count=200 File=/dev/nvidia[0-1]
NodeName=h1 Name=gpu File=/dev/nvidia[0-7]
"""
    assert gres_map(conf, "g2", [0, 1, 2, 3]) == GresMap((2, 3, 0, 1), proven=True)
    assert gres_map(conf, "h1", []) == GresMap(tuple(range(8)), proven=True)
    assert gres_map(conf, "g2", []).minor(1) == 3 and gres_map(conf, "g2", []).minor(4) is None
    # No AutoDetect line at all: off, Slurm's default for a node with Name=gpu lines.
    assert gres_map("Name=gpu File=/dev/nvidia[1,0]", "x", []).minors == (1, 0)


@pytest.mark.parametrize(
    "conf",
    [
        "AutoDetect=nvml\nName=gpu File=/dev/nvidia[0-3]",  # re-sorted by PCI bus ID
        "NodeName=g2 AutoDetect=nvml Name=gpu File=/dev/nvidia[0-3]",
        "AutoDetect=nvml",
        "Name=gpu Type=a100 Count=4",  # no File=
        "Name=gpu MultipleFiles=/dev/nvidia-caps/nvidia-cap[21,30]",
        "Name=gpu File=/dev/nvidia[0-3] Count=2",
        "Name=gpu File=/dev/nvidia0,/dev/nvidia0",
        "Name=gpu File=/dev/nvidiactl",
        "Name=gpu File=/dev/nvidia-caps/nvidia-cap[21-24]",  # MIG capabilities: no GPU minors
        "Name=gpu File=/dev/dri/card[0-3]",
        "Include /etc/slurm/gres.d/gpu.conf\nName=gpu File=/dev/nvidia[0-3]",
        "NodeName=g[2- Name=gpu File=/dev/nvidia[0-3]",
        "Name=gpu File=/dev/nvidia[0-3]\x1b",
        "",
    ],
)
def test_gres_conf_unproven_falls_back_to_minor_order(conf: str) -> None:
    assert gres_map(conf, "g2", [3, 1, 0, 2]) == GresMap((0, 1, 2, 3), proven=False)


def test_gres_conf_node_filters() -> None:
    conf = "AutoDetect=nvml\nNodeName=g2 AutoDetect=off Name=gpu File=/dev/nvidia[4-5]"
    assert gres_map(conf, "g2", [4, 5]) == GresMap((4, 5), proven=True)
    assert gres_map(conf, "g3", [4, 5]) == GresMap((4, 5), proven=False)  # global nvml
