"""A status runs ``fuser`` only where memory does not add up, and says so when it did not
(issue 24): the rule in Python and in bash, the same answers, and a probe that skipped it."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpubot.core.models import ComputeApp, GpuInfo, NodeConfig, NodeSnapshot
from gpubot.core.probe import script as probe_script
from gpubot.core.probe.holders import ADDS_UP, NOT_CHECKED, Holders, memory_adds_up
from gpubot.core.probe.nvsmi import parse_apps_answer, parse_gpu_answer
from gpubot.core.probe.snapshot import parse_probe, probe_argv
from gpubot.errors import ParseError
from tests.fixtures.probe_box import BUS, SLEEP_PY, SMI, U, run, set_minors


def gpu(i: int, used: int | None) -> GpuInfo:
    return GpuInfo(i, U[i], "NVIDIA H200", used, 143771, 0)


def app(i: int, used: int | None, pid: int = 100) -> ComputeApp:
    return ComputeApp(pid + i, U[i], used)


@pytest.mark.parametrize(
    ("gpus", "apps", "adds_up"),
    [
        ([gpu(0, 0), gpu(1, 3)], [], True),  # idle GPUs: the driver's own few MiB
        ([gpu(0, 256)], [], True),
        ([gpu(0, 257)], [], False),  # memory nobody listed: a leak, a hidden holder
        ([gpu(0, 40000)], [app(0, 39900)], True),
        ([gpu(0, 40000)], [app(0, 20000), app(0, 19800, 200)], True),  # two processes
        ([gpu(0, 40000)], [app(0, 39000)], False),
        ([gpu(0, 40000), gpu(1, 40000)], [app(0, 40000), app(0, 40000, 200)], False),  # wrong GPU
        ([gpu(0, None)], [], False),  # unknown: never adds up
        ([gpu(0, 1000)], [app(0, None)], False),
        ([gpu(0, 0)], [app(1, None)], False),  # an app whose memory is unknown, anywhere
    ],
)
def test_memory_adds_up(gpus: list[GpuInfo], apps: list[ComputeApp], adds_up: bool) -> None:
    assert memory_adds_up(gpus, apps) is adds_up


def bash_adds_up(gpus: str, apps: str) -> bool:
    script = probe_script._COMMON + ADDS_UP + 'adds_up "$1" "$2" && echo yes || echo no'
    p = subprocess.run(["bash", "-c", script, "t", gpus, apps], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip() == "yes"


MEM = st.one_of(st.integers(0, 90000), st.just("[N/A]"))


@settings(max_examples=60, deadline=None)
@given(
    used=st.lists(MEM, min_size=1, max_size=3),
    apps=st.lists(st.tuples(st.integers(0, 2), MEM), max_size=4),
    mig=st.booleans(),
)
def test_the_node_never_skips_fuser_where_the_parser_would_not(
    used: list[int | str], apps: list[tuple[int, int | str]], mig: bool
) -> None:
    gpus_csv = "".join(
        f"{i}, {U[i]}, {BUS[i]}, {'Enabled' if mig and i == 0 else 'Disabled'}, NVIDIA H200, "
        f"{m}, 143771, 0\n"
        for i, m in enumerate(used)
    )
    apps_csv = "".join(f"{100 + k}, {U[g]}, {m}\n" for k, (g, m) in enumerate(apps))
    gpus, _ = parse_gpu_answer("n1", 0, gpus_csv, "")
    parsed = parse_apps_answer("n1", 0, apps_csv, "")
    python = memory_adds_up(gpus, parsed)
    node = bash_adds_up(gpus_csv, apps_csv)
    assert not node or python  # every skip the node makes, the parser accepts
    if not mig:
        assert node == python  # and without MIG both say the same


# ---- probes --------------------------------------------------------------------------------


@dataclass
class Box:
    dir: Path
    cfg: NodeConfig
    hidden: int  # holds GPU 1's device file; nvidia-smi does not list it

    def probe(
        self, holders: Holders, used: tuple[int, int] = (0, 0), script: str = ""
    ) -> NodeSnapshot:
        (self.dir / "gpus").write_text(
            "".join(
                f"{i}, {U[i]}, {BUS[i]}, Disabled, NVIDIA H200, {m}, 143771, 0\n"
                for i, m in enumerate(used)
            )
        )
        argv = probe_argv(self.cfg, smi_timeout_s=5, budget_s=60, holders=holders, state_dir="")
        argv[2] = script or argv[2]
        return parse_probe(self.cfg, run(argv), 1.0)


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    d = tmp_path_factory.mktemp("holders")
    dev = d / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (dev / name).touch()
    set_minors(d / "driver", [0, 1])
    (d / "nvidia-smi").write_text(SMI)
    (d / "nvidia-smi").chmod(0o755)
    (d / "apps").write_text("")
    fd = os.open(dev / "nvidia1", os.O_RDONLY)
    p = subprocess.Popen(SLEEP_PY, pass_fds=[fd])
    os.close(fd)
    cfg = NodeConfig(
        name="n1",
        host="unused",
        dev_prefix=f"{dev}/nvidia",
        nvidia_smi=str(d / "nvidia-smi"),
        driver_dir=str(d / "driver"),
    )
    try:
        yield Box(d, cfg, p.pid)
    finally:
        p.kill()
        p.wait()


def test_a_status_whose_memory_adds_up_skips_fuser_and_says_so(box: Box) -> None:
    snap = box.probe(Holders.IF_UNEXPLAINED)
    assert not snap.holders_checked and NOT_CHECKED in snap.notes
    assert snap.processes == ()  # the idle holder of GPU 1's file is not looked for
    # Everything else asks fuser, and finds it; no note.
    snap = box.probe(Holders.ALWAYS)
    assert snap.holders_checked and NOT_CHECKED not in snap.notes
    assert [(p.pid, p.gpu_index, p.hidden) for p in snap.processes] == [(box.hidden, 1, True)]


def test_a_status_whose_memory_does_not_add_up_asks_fuser(box: Box) -> None:
    snap = box.probe(Holders.IF_UNEXPLAINED, used=(0, 4096))  # GPU 1: memory nobody listed
    assert snap.holders_checked and NOT_CHECKED not in snap.notes
    assert [(p.pid, p.hidden) for p in snap.processes] == [(box.hidden, True)]


def test_control_a_node_that_skips_fuser_on_unexplained_memory_is_a_parse_error(
    box: Box,
) -> None:
    # The node's rule replaced by "always adds up": the parser does not take the skip.
    script = probe_script.PROBE_SCRIPT
    start = script.index("adds_up() {")
    end = script.index("\n}\n", start) + 3
    lying = script[:start] + "adds_up() { return 0; }\n" + script[end:]
    with pytest.raises(ParseError, match="fuser skipped on memory that does not add up"):
        box.probe(Holders.IF_UNEXPLAINED, used=(0, 4096), script=lying)
    assert shutil.which("fuser")  # the real one ran in the tests above
