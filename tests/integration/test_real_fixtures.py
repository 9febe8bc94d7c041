"""The parts the real-runtime tests stand on: ``SimNode.adopt`` and a runtime that cannot start.

``SimNode.adopt``: a process the fleet did not start holds a simulated GPU, as a real
container's or Slurm job's does in ``test_real_containers`` and ``test_real_slurm``. Here the
process is a plain ``sh`` this test starts: it opens the GPU's device file and sleeps.

A runtime fixture that cannot start its daemon fails the test with the daemon's own words (never
a skip), and leaves nothing behind.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from gpusim import simstate
from gpusim.adopt import holds
from gpusim.errors import SimUsageError
from gpusim.fleet import SimFleet, SimNode
from tests.fixtures.daemons import running
from tests.fixtures.runtimes import DockerEngine
from tests.procs import alive, wait_until


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(tmp_path_factory.mktemp("adopt"), nodes=1, gpus=2, release_delay_s=0.3) as f:
        yield f


@pytest.fixture
def node(fleet: SimFleet) -> Iterator[SimNode]:
    n = fleet.node("node1")
    yield n
    n.clear()


@pytest.fixture
def holder(node: SimNode) -> Iterator[subprocess.Popen[bytes]]:
    """A process of this test's holding GPU 1's device file (killed and reaped after it)."""
    script = f"exec 3<>{node.device(1)}; exec sleep 1000000"
    p = subprocess.Popen(["sh", "-c", script])
    wait_until(lambda: holds(p.pid, node.device(1)), 10, "the holder opened the device")
    yield p
    p.kill()
    p.wait(10)


def compute_apps(node: SimNode) -> list[str]:
    out = subprocess.run(
        [node.nvidia_smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return out.stdout.splitlines()


def test_an_adopted_process_is_a_compute_app_until_it_dies(
    node: SimNode, holder: subprocess.Popen[bytes]
) -> None:
    assert compute_apps(node) == []
    w = node.adopt(holder.pid, 1, 4096)
    assert compute_apps(node) == [f"{holder.pid}, 4096 MiB"]
    assert node.state()["gpus"][1]["memory_used_mib"] == 4096
    assert (w.pid, w.gpu, w.mib, w.behaviour, w.name) == (holder.pid, 1, 4096, "adopted", "sleep")
    with pytest.raises(SimUsageError, match="already"):
        node.adopt(holder.pid, 1, 4096)
    holder.kill()
    holder.wait(10)
    # The driver saw the death: gone from the list at once, memory freed release_delay_s later.
    wait_until(lambda: compute_apps(node) == [], 5, "the dead process unlisted")
    wait_until(lambda: node.state()["gpus"][1]["memory_used_mib"] == 0, 5, "its memory freed")


def test_the_fleet_never_signals_an_adopted_process(
    node: SimNode, holder: subprocess.Popen[bytes]
) -> None:
    node.adopt(holder.pid, 1, 1000)
    spawned = node.spawn(gpu=0, mib=1000)
    assert node.kill_workloads() == 1  # the fleet's own workload only
    assert not alive(spawned.pid) and alive(holder.pid)
    # The control: without the mark that it was adopted, the fleet would kill it too.
    with simstate.transaction(str(node.state_dir)) as state:
        for a in state["allocs"]:
            a.pop("adopted", None)
    assert node.kill_workloads() == 1
    holder.wait(10)
    assert not alive(holder.pid)


@pytest.mark.parametrize("gpu", [0, 2, -1])
def test_adopt_refuses_what_would_make_the_simulator_lie(
    node: SimNode, holder: subprocess.Popen[bytes], gpu: int
) -> None:
    with pytest.raises(SimUsageError):  # GPU 0's file is not open; GPUs 2 and -1 do not exist
        node.adopt(holder.pid, gpu, 1000)
    with pytest.raises(SimUsageError, match="no live process"):
        node.adopt(2**22 + 7, 1, 1000)
    with pytest.raises(SimUsageError, match="more than a GPU holds"):
        node.adopt(holder.pid, 1, node.memory_mib + 1)
    assert compute_apps(node) == []


def test_a_runtime_that_cannot_start_fails_with_its_daemons_words() -> None:
    engine = DockerEngine(extra_args=("--no-such-option",))
    # Caught whatever it is: a skip (pytest's Skipped) must not pass for a failure.
    with pytest.raises(BaseException) as failed, running(engine):
        raise AssertionError("a runtime that did not start was used")
    assert failed.type is pytest.fail.Exception
    said = str(failed.value)
    assert said.startswith("docker did not start: dockerd exited with status")
    assert "unknown flag: --no-such-option" in said  # dockerd's own log line
    assert engine.daemons[0].proc.returncode not in (None, 0)
    assert not os.path.exists(engine.root)  # stopped and removed all the same
