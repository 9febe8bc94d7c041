"""The health exec's PCI section run by bash over a sysfs-shaped folder (``core.health.state``):
which devices it lists as GPUs, and a folder that is not there."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gpubot.core.health.state import health_argv, parse_health


def test_the_health_exec_lists_nvidias_display_controllers_only(tmp_path: Path) -> None:
    """The real script over a sysfs-shaped folder: a 3D controller and a VGA one are GPUs; an
    NVSwitch (bridge), an audio function, another vendor's GPU and a broken entry are not."""
    devices = {
        "0000:18:00.0": ("0x10de", "0x030200"),
        "0000:2a:00.0": ("0x10de", "0x030000"),
        "0000:05:00.0": ("0x10de", "0x068000"),
        "0000:18:00.1": ("0x10de", "0x040300"),
        "0000:c1:00.0": ("0x1002", "0x030000"),
    }
    for bus, (vendor, cls) in devices.items():
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "vendor").write_text(vendor + "\n")
        (tmp_path / bus / "class").write_text(cls + "\n")
    (tmp_path / "0000:3a:00.0").mkdir()  # no vendor file
    argv = health_argv("/bin/false", 1.0, pci_dir=str(tmp_path))
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    assert parse_health(out).pci == ("0000:18:00.0", "0000:2a:00.0")
    gone = health_argv("/bin/false", 1.0, pci_dir=str(tmp_path / "absent"))
    out = subprocess.run(gone, capture_output=True, text=True, timeout=30, check=True).stdout
    h = parse_health(out)
    assert h.pci is None and "the kernel's PCI devices not read: no such folder" in h.notes
