"""``gpubot_gpu_holder_memory_bytes``: one series per holder of a GPU, as the last sweep saw it.

Read back through prometheus_client's own parser (what Prometheus reads), never by matching the
text: a label value that broke the exposition would show as a missing or extra series here.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.runtimes.base import Workload
from gpubot.metrics import HOLDER_LABEL_MAX, MIB, Metrics

GAUGE = "gpubot_gpu_holder_memory_bytes"
TRAIN = Workload("docker", "9f1c" * 16, "train-llama", "alice")
JOB = Workload("slurm", "8812", "sweep-lr", "bob").with_detail(step="0")
SESSION = Workload("session", "session-7.scope")  # a login session: no workload to name

Series = dict[tuple[tuple[str, str], ...], float]


def holders(m: Metrics) -> Series:
    """The gauge's series: their labels (sorted pairs) and values."""
    return {
        tuple(sorted(s.labels.items())): s.value
        for fam in text_string_to_metric_families(m.text())
        if fam.name == GAUGE
        for s in fam.samples
    }


def proc(pid: int, gpu: int, mib: int | None, name: str, **kw: Any) -> GpuProcess:
    return GpuProcess(pid, gpu, mib, name, mib is not None, True, **kw)


def key(gpu: int, uuid: str, user: str, workload: str) -> tuple[tuple[str, str], ...]:
    labels = {"node": "n1", "gpu": str(gpu), "uuid": uuid, "user": user, "workload": workload}
    return tuple(sorted(labels.items()))


GPUS = (
    GpuInfo(0, "GPU-a", "H200", 30000, 143771, 90),
    GpuInfo(1, "GPU-b", "H200", 4000, 143771, 0),
    GpuInfo(2, "GPU-c", "H200", 0, 143771, 0),
)


def test_one_series_per_holder_summed_over_its_processes() -> None:
    procs = (
        proc(10, 0, 20000, "python3", user="root", workload=TRAIN),  # a root container of alice
        proc(11, 0, 6000, "python3", user="root", workload=TRAIN),  # ... its second process
        proc(12, 0, None, "python3", user="root", workload=TRAIN),  # memory unsaid: adds nothing
        proc(13, 0, 4000, "torchrun", user="bob", workload=JOB),
        proc(14, 1, 4000, "jupyter", user="carol", workload=SESSION),  # named by its process
        proc(15, 1, None, "nvtop", user="dave"),  # holds the device file, memory unsaid
    )
    m = Metrics()
    m.observe_sweep([NodeSnapshot("n1", 0.0, GPUS, procs)], [], 1.0, {})
    assert holders(m) == {
        key(0, "GPU-a", "alice", "docker:train-llama"): 26000 * MIB,
        key(0, "GPU-a", "bob", "slurm:8812.0"): 4000 * MIB,
        key(1, "GPU-b", "carol", "jupyter"): 4000 * MIB,
    }  # dave's nvtop said no memory: no series, never a 0; GPU 2 has no holder: none


def test_a_holder_gone_at_the_next_sweep_is_a_series_gone() -> None:
    m = Metrics()
    for pid in range(100, 130):  # thirty short jobs, one after the other, on one GPU
        job = Workload("slurm", str(pid), None, "bob")
        snap = NodeSnapshot("n1", 0.0, GPUS, (proc(pid, 0, 1000, "python3", workload=job),))
        m.observe_sweep([snap], [], 1.0, {})
    assert holders(m) == {key(0, "GPU-a", "bob", "slurm:129"): 1000 * MIB}
    m.observe_sweep([NodeSnapshot("n1", 0.0, GPUS)], [], 1.0, {})
    assert holders(m) == {}
    m.observe_sweep([], ["n1"], 1.0, {})  # a node that did not answer: no series, none stale
    assert holders(m) == {}


def test_a_hostile_process_name_is_one_bounded_printable_label() -> None:
    name = 'x"} 1\nevil{a="\\\x1b[31m\x00'
    long = Workload("docker", "ab" * 32, "n" * 300, "alice")
    procs = (
        proc(20, 0, 1000, name, user="mallory"),
        proc(21, 1, 2000, "python3", user="root", workload=long),
    )
    m = Metrics()
    m.observe_sweep([NodeSnapshot("n1", 0.0, GPUS, procs)], [], 1.0, {})
    got = holders(m)
    printable = 'x"} 1\\x0aevil{a="\\\\x1b[31m\\x00'
    cut = "docker:" + "n" * (HOLDER_LABEL_MAX - len("docker:") - 1) + "…"
    assert got == {
        key(0, "GPU-a", "mallory", printable): 1000 * MIB,
        key(1, "GPU-b", "alice", cut): 2000 * MIB,
    }
    assert not [f for f in text_string_to_metric_families(m.text()) if f.name.startswith("evil")]
