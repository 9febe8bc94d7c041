"""GPUs that vanished (``core.health.vanished``) and the health exec's PCI section, in tables;
the sweep of the simulated fleet is tests/integration/test_sweep_health.py."""

from __future__ import annotations

import tomllib

import pytest

from gpubot.config import parse
from gpubot.core.health.vanished import VanishedMemory, find_vanished
from gpubot.core.models import GpuInfo, NodeSnapshot
from gpubot.errors import ConfigError

BUSES = ("00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0")
PCI = ("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0")


def snap(*keep: int, lost: int | None = None) -> NodeSnapshot:
    gpus = [GpuInfo(i, f"GPU-{i}", "H100", 0, 1, 0, bus_id=BUSES[i]) for i in keep]
    if lost is not None:  # nvidia-smi's "Unable to determine the device handle": gpu-lost's
        gpus.append(GpuInfo(lost, "", "?", None, None, None, BUSES[lost], None, ("lost",)))
    return NodeSnapshot("n", 0.0, tuple(gpus))


def sweep(
    s: NodeSnapshot, pci: tuple[str, ...] | None, mem: VanishedMemory, gpus: int | None = None
) -> tuple[list[str], VanishedMemory]:
    found, mem = find_vanished([s], {"n": pci}, {} if gpus is None else {"n": gpus}, mem)
    assert all(f.kind.value == "gpu-vanished" and f.gpu is None for f in found)
    return [f.summary for f in found], mem


def test_missing_from_nvidia_smi_only_and_from_both() -> None:
    found, mem = sweep(snap(0, 1, 2, 3), PCI, VanishedMemory())
    assert found == []
    (text,), _ = sweep(snap(0, 2), PCI[:3], mem)
    assert text.startswith("nvidia-smi shows 2 of the node's 4 GPUs: ")
    assert "0000:2a:00.0 missing from nvidia-smi only (the kernel still sees it on PCI" in text
    assert "0000:5d:00.0 missing from nvidia-smi and from the kernel's PCI devices" in text


def test_the_setting_counts_gpus_never_seen() -> None:
    (text,), _ = sweep(snap(0, 1, 2), PCI[:3], VanishedMemory(), gpus=4)
    assert "nvidia-smi shows 3 of the node's 4 GPUs" in text
    assert "1 more the node should have, not seen by nvidia-smi nor on PCI" in text


def test_without_the_pci_section_the_memory_still_names_the_gpu() -> None:
    _, mem = sweep(snap(0, 1), None, VanishedMemory())
    (text,), _ = sweep(snap(0), None, mem)
    assert "0000:2a:00.0 missing from nvidia-smi (the kernel's PCI devices not read)" in text


def test_control_a_whole_node_and_a_lost_gpu_are_no_vanished_gpu() -> None:
    """All there (settings agree); a lost GPU is listed (gpu-lost says so): no finding."""
    _, mem = sweep(snap(0, 1, 2, 3), PCI, VanishedMemory(), gpus=4)
    assert sweep(snap(0, 1, 2, 3), PCI, mem, gpus=4)[0] == []
    assert sweep(snap(0, 1, 2, lost=3), PCI, mem, gpus=4)[0] == []


def test_control_the_memory_is_the_callers_to_keep() -> None:
    """A sweep by hand (not advanced) forgets: the next one from an empty memory finds nothing."""
    sweep(snap(0, 1), PCI[:2], VanishedMemory())
    assert sweep(snap(0), PCI[:1], VanishedMemory())[0] == []


NODE = '[[nodes]]\nname = "a"\nhost = "h"\n'


def test_gpus_come_from_the_node_or_its_groups() -> None:
    s = parse(
        tomllib.loads(
            "[groups.hgx]\ngpus = 8\n"
            + NODE
            + 'groups = ["hgx"]\n'
            + '[[nodes]]\nname = "b"\nhost = "h"\ngroups = ["hgx"]\ngpus = 4\n'
            + '[[nodes]]\nname = "c"\nhost = "h"\npci_dir = "/srv/sys/pci"\n'
        )
    )
    assert [(n.gpus, n.pci_dir) for n in s.nodes] == [
        (8, "/sys/bus/pci/devices"),
        (4, "/sys/bus/pci/devices"),
        (None, "/srv/sys/pci"),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (NODE + "gpus = 0\n", "nodes[0].gpus: 0 is not a GPU count (1-256)"),
        (NODE + "gpus = true\n", "nodes[0].gpus: True is not a GPU count"),
        ("[groups.g]\ngpus = '8'\n" + NODE + "groups = ['g']\n", "groups.g.gpus: '8' is not"),
        (NODE + "pci_dir = 'sys'\n", "nodes[0].pci_dir: 'sys' is not an absolute path"),
    ],
)
def test_gpu_count_mistakes_are_named(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=None) as err:
        parse(tomllib.loads(text))
    assert message in str(err.value) and "\n" not in str(err.value)
