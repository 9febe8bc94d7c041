"""The host side of a simulated node's kernel log: the fault API that writes Xid and SXid lines.

``SimNode.kernel`` (a ``KernelLog``) appends records to ``<state>/kernel.log`` that the node's
stand-in ``journalctl`` and ``dmesg`` answer with (``gpusim.kernlog``). ``xid(gpu, code)`` writes
the line the driver writes for that GPU (its bus id as ``NVRM: Xid (PCI:dddd:bb:dd)``), in the
format of a real line published in a public thread (``TEMPLATES``, each cited); ``sxid`` writes
an NVSwitch line. ``pid`` and ``name`` are what the kernel would copy from the faulting process
(the name is its comm: a user's choice; the kernel truncates it to 15 bytes, as here).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpusim.errors import SimUsageError
from gpusim.kernlog import (
    LOG_FILE,
    LOGGER_MODE_FILE,
    LOGGER_MODES,
    MODE_FILE,
    MODES,
    SYSLOG_FILE,
    records,
    user_records,
)

# Real lines after "NVRM: Xid (PCI:dddd:bb:dd): CODE, " (the pid/name part is added when given).
TEMPLATES: dict[int, tuple[str, str]] = {
    13: (
        "Graphics Exception: ESR 0x52e7b0=0x101000e 0x52e7b4=0x4 0x52e7a8=0xc81eb60 "
        "0x52e7ac=0x1174",
        "https://github.com/vllm-project/vllm/issues/5901 (comment, 2024-08-23)",
    ),
    31: (
        "Ch 00000023, intr 00000000. MMU Fault: ENGINE CE0 HUBCLIENT_HSCE0 faulted @ "
        "0x0_0abe0000. Fault is of type FAULT_PTE ACCESS_TYPE_VIRT_READ",
        "https://github.com/NVIDIA/open-gpu-kernel-modules/issues/363",
    ),
    45: (
        "Ch 00000001 caused by previous Xid 149",
        "https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1150",
    ),
    63: (
        "Row Remapper: New row marked for remapping, reset gpu to activate.",
        "https://github.com/stas00/ml-engineering compute/accelerator/nvidia/debug.md",
    ),
    74: (
        "NVLink: fatal error detected on link 5(0x0, 0x0, 0x0, 0x0, 0x0, 0x0, 0x0)",
        "gpusim's own: NVIDIA's catalog names Xid 74 NVLINK_ERROR (no thread line kept)",
    ),
    79: (
        "GPU has fallen off the bus.",
        "https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1151",
    ),
    94: (
        "Contained ECC error",
        "https://github.com/leptonai/gpud/pull/1174 (description)",
    ),
    95: (
        "Uncontained ECC error",
        "gpusim's own, shaped as Xid 94's line of leptonai/gpud#1174",
    ),
    119: (
        "Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 76 "
        "(GSP_RM_CONTROL) (0x20801813 0x4c).",
        "leptonai/gpud pkg/nvidia-query/xid/testdata/dmesg-with-xid-119.log",
    ),
}
SXID_TEMPLATE = (
    "Data {0x000001c0, 0x00bd5c8a, 0x00000500, 0x00000064, 0x00000000, 0x40008000, "
    "0x5a001100, 0x00000000, 0x00000000}",
    "https://github.com/leptonai/gpud/pull/338 (SXid 12028 in dmesg)",
)


class KernelLog:
    """A simulated node's kernel log and its mode."""

    def __init__(self, state_dir: Path, bus_ids: list[str]) -> None:
        self.state_dir = state_dir
        self.bus_ids = bus_ids  # nvidia-smi's, by GPU index ("00000000:18:00.0")
        self._seq: int | None = None  # the last record's (this host is the only writer)

    def write(self, message: str, at: float | None = None) -> None:
        """Append one kernel message (one line)."""
        if "\n" in message or "\t" in message:
            raise SimUsageError("a kernel message is one line without tabs")
        path = self.state_dir / LOG_FILE
        if self._seq is None:
            self._seq = max((r[0] for r in records(str(self.state_dir))), default=0)
        self._seq += 1
        seq = self._seq
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{seq}\t{time.time() if at is None else at}\t{message}\n")
        os.chmod(path, 0o644)

    def xid_bus(self, gpu: int) -> str:
        """Return GPU ``gpu``'s bus id as an Xid line writes it (``0000:18:00``)."""
        domain, bus, dev = self.bus_ids[gpu].split(":")
        return f"{domain[-4:]}:{bus}:{dev.split('.')[0]}".lower()

    def xid(
        self,
        gpu: int,
        code: int,
        *,
        pid: int | None = None,
        name: str | None = None,
        text: str | None = None,
        bus: str | None = None,
    ) -> str:
        """Write the driver's Xid ``code`` line for GPU ``gpu`` (``bus``: another bus id)."""
        words = text if text is not None else TEMPLATES.get(code, ("Xid", ""))[0]
        who = ""
        if pid is not None or name is not None:
            comm = (name or "<unknown>").encode()[:15].decode(errors="replace")
            shown = "'<unknown>'" if pid is None else str(pid)
            who = f"pid={shown}, name={comm}, "
        line = f"NVRM: Xid (PCI:{bus or self.xid_bus(gpu)}): {code}, {who}{words}"
        self.write(line)
        return line

    def sxid(self, code: int, *, switch: int = 0, bus: str = "0000:84:00.0", text: str = "") -> str:
        """Write an NVSwitch SXid line."""
        line = f"nvidia-nvswitch{switch}: SXid (PCI:{bus}): {code}, {text or SXID_TEMPLATE[0]}"
        self.write(line)
        return line

    def set_mode(self, mode: str) -> None:
        """Set what the stand-ins may read (``gpusim.kernlog.MODES``)."""
        if mode not in MODES:
            raise SimUsageError(f"kernel log mode must be one of {', '.join(MODES)}")
        path = self.state_dir / MODE_FILE
        path.write_text(mode + "\n", encoding="ascii")
        os.chmod(path, 0o644)

    def set_logger_mode(self, mode: str) -> None:
        """Set how the node's ``logger`` behaves (``gpusim.kernlog.LOGGER_MODES``)."""
        if mode not in LOGGER_MODES:
            raise SimUsageError(f"logger mode must be one of {', '.join(LOGGER_MODES)}")
        path = self.state_dir / LOGGER_MODE_FILE
        path.write_text(mode + "\n", encoding="ascii")
        os.chmod(path, 0o644)

    def user_lines(self, tag: str) -> list[str]:
        """Return the messages ``logger -t TAG`` wrote on the node, oldest first."""
        return [
            str(r.get("message")) for r in user_records(str(self.state_dir)) if r.get("tag") == tag
        ]

    def clear(self) -> None:
        """Empty the logs and set the modes back to ``journal``."""
        for name in (LOG_FILE, MODE_FILE, SYSLOG_FILE, LOGGER_MODE_FILE):
            (self.state_dir / name).unlink(missing_ok=True)
        self._seq = None
