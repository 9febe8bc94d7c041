"""The files of one simulated node: directories, device files, the driver's folder, launchers.

A node directory holds ``dev/`` (device files), ``bin/nvidia-smi`` (a launcher of the standalone
``gpusim.nvidia_smi``), ``driver/gpus/<bus id>/information``, ``exe/`` (links to the interpreter
named as workloads are), ``sbin/`` (copies of it, for daemons), ``log/`` and ``state/``; a sudo
node also ``sbin-sudo/sudo`` (a launcher of ``gpusim.sudo``) with ``sudoers.json``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpusim import simstate
from gpusim.errors import SimError, SimUsageError
from gpusim.workload import PAGE

# PCI bus ids of the eight GPUs of an HGX H100/H200 board, as nvidia-smi prints them.
HGX_BUS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
# (sub-directory, mode): workloads of other users write their records under state/.
NODE_DIRS = (
    ("", 0o755),
    ("dev", 0o755),
    ("bin", 0o755),
    ("exe", 0o755),
    ("log", 0o755),
    ("state", 0o777),
    ("state/run", 0o777),
)


def gpu_uuid(node: str, index: int) -> str:
    """Return the stable UUID of GPU ``index`` of ``node``."""
    h = hashlib.sha256(f"gpusim/{node}/{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def bus_id(index: int) -> str:
    """Return the PCI bus id of GPU ``index``."""
    bus = HGX_BUS[index] if index < len(HGX_BUS) else f"{0xE0 + index - len(HGX_BUS):02X}"
    return f"00000000:{bus}:00.0"


def gpu_records(
    node: str, model: str, memory_mib: int, minors: Sequence[int]
) -> list[dict[str, Any]]:
    """Return the state's record of each GPU of ``node`` (GPU index i has device minor[i])."""
    return [
        {
            "index": i,
            "uuid": gpu_uuid(node, i),
            "name": model,
            "memory_total": memory_mib,
            "bus_id": bus_id(i),
            "minor": minor,
        }
        for i, minor in enumerate(minors)
    ]


def make_tree(node_dir: Path, minors: Sequence[int]) -> None:
    """Create the node's directories and its device files (by minor, plus ctl and uvm)."""
    for sub, mode in NODE_DIRS:
        d = node_dir / sub
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, mode)
    for n in [f"nvidia{m}" for m in minors] + ["nvidiactl", "nvidia-uvm"]:
        path = node_dir / "dev" / n
        path.write_bytes(b"\0" * PAGE)  # one page, so that workloads can map it
        os.chmod(path, 0o666)


def write_information(driver_dir: str, g: dict[str, Any]) -> None:
    """Write the driver's ``gpus/<bus id>/information`` of one GPU, in the real layout."""
    domain, rest = g["bus_id"].split(":", 1)
    bus = f"{int(domain, 16):04x}:{rest.lower()}"
    folder = Path(driver_dir) / "gpus" / bus
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "information").write_text(
        f"Model: \t\t {g['name']}\nIRQ:   \t\t {200 + g['index']}\n"
        f"GPU UUID: \t {g['uuid']}\nVideo BIOS: \t 96.00.74.00.11\nBus Type: \t PCIe\n"
        f"DMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t {bus}\n"
        f"Device Minor: \t {g['minor']}\nGPU Excluded:\t No\n",
        encoding="utf-8",
    )


# Devices beside the GPUs, as a GPU box's /sys/bus/pci/devices has them: an NVSwitch (NVIDIA,
# class bridge), a GPU's HDMI audio function (NVIDIA, class audio), a NIC (Mellanox).
OTHER_PCI = {
    "0000:05:00.0": ("0x10de", "0x068000"),
    "0000:18:00.1": ("0x10de", "0x040300"),
    "0000:0c:00.0": ("0x15b3", "0x020700"),
}


def pci_name(bus: str) -> str:
    """Return nvidia-smi's ``00000000:18:00.0`` as sysfs names it: ``0000:18:00.0``."""
    domain, rest = bus.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def write_driver(driver_dir: str, pci_dir: str, gpus: list[dict[str, Any]]) -> None:
    """Write each GPU's driver folder (``write_information``) and the node's PCI devices."""
    for g in gpus:
        write_information(driver_dir, g)
    write_pci(pci_dir, gpus)


def write_pci(pci_dir: str, gpus: list[dict[str, Any]]) -> None:
    """Write the sysfs stand-in: ``<pci_dir>/<bus id>/vendor`` and ``class`` for each GPU (a 3D
    controller, 0x030200) and for a few devices that are no GPU (``OTHER_PCI``)."""
    devices = {pci_name(g["bus_id"]): ("0x10de", "0x030200") for g in gpus}
    for bus, (vendor, cls) in {**OTHER_PCI, **devices}.items():
        folder = Path(pci_dir) / bus
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "vendor").write_text(vendor + "\n", encoding="utf-8")
        (folder / "class").write_text(cls + "\n", encoding="utf-8")


def init_state(state_dir: Path, state: simstate.State) -> None:
    """Create the state lock (everyone may take it) and save the node's first state."""
    lock = state_dir / simstate.LOCK_FILE
    lock.touch()
    os.chmod(lock, 0o666)
    with simstate.locked(str(state_dir)):
        simstate.save(str(state_dir), state)


def write_launcher(
    path: Path, python: str, lib_dir: Path, doc: str, module: str, args: str
) -> None:
    """Write an executable ``#!PYTHON -S`` script that exits with ``gpusim.MODULE.main(ARGS)``."""
    path.write_text(
        f"#!{python} -S\n"
        f'"""{doc}"""\n'
        "import sys\n"
        f"sys.path.insert(0, {str(lib_dir)!r})\n"
        f"from gpusim.{module} import main\n"
        f"sys.exit(main({args}))\n",
        encoding="utf-8",
    )
    os.chmod(path, 0o755)


def write_kernlog(directory: Path, python: str, lib_dir: Path, node: str, state: Path) -> None:
    """Write the node's stand-in ``journalctl``, ``dmesg`` and ``logger`` (``gpusim.kernlog``)."""
    directory.mkdir(exist_ok=True)
    os.chmod(directory, 0o755)
    for prog in ("journalctl", "dmesg", "logger"):
        doc = f"{prog} of the simulated node {node} (gpusim.kernlog)."
        args = f"{prog!r}, sys.argv[1:], {str(state)!r}"
        write_launcher(directory / prog, python, lib_dir, doc, "kernlog", args)


def write_sudo_files(sudo_dir: Path, rule_path: Path, log_path: Path, rule: dict[str, Any]) -> None:
    """Write the sudo stand-in's rule file (``sudoers.node_rule``) and an empty log, and make
    the directory of its launcher; all readable by every user."""
    rule_path.write_text(json.dumps(rule, indent=2) + "\n", encoding="utf-8")
    os.chmod(rule_path, 0o644)
    log_path.write_bytes(b"")
    os.chmod(log_path, 0o644)
    sudo_dir.mkdir(exist_ok=True)
    os.chmod(sudo_dir, 0o755)


def check_exe_name(name: str, what: str) -> None:
    """Raise ``SimUsageError`` unless ``name`` can be one file name (``what``: for the message)."""
    if not name or "/" in name or "\0" in name or name in (".", "..") or len(name) > 100:
        raise SimUsageError(f"bad {what} name {name!r}")


def exe_link(node_dir: Path, name: str, python_real: str) -> str:
    """Return a link named ``name`` to the interpreter: exec'd through it, comm is ``name``."""
    link = node_dir / "exe" / name
    if not link.is_symlink():
        with contextlib.suppress(FileExistsError):
            link.symlink_to(python_real)
    return str(link)


def interpreter_copy(node: str, node_dir: Path, python_real: str, path: str) -> str:
    """Make ``path`` (inside ``node_dir``) a copy of the interpreter; return it."""
    target = Path(os.path.realpath(os.path.abspath(path)))
    if not target.is_relative_to(os.path.realpath(node_dir)):
        raise SimUsageError(f"{node}: {path!r} is outside the node's directory {node_dir}")
    if target.is_symlink() or (target.exists() and not target.is_file()):
        raise SimUsageError(f"{node}: {path!r} is not a regular file")
    if not target.exists():
        # A link of a finished copy: a racing spawn never execs a half-written file, and
        # a running daemon's file is never replaced (its /proc/PID/exe would say deleted).
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}")
        try:
            shutil.copyfile(python_real, tmp)
            os.chmod(tmp, 0o755)
            with contextlib.suppress(FileExistsError):
                os.link(tmp, target)
        except OSError as exc:
            why = f"cannot copy the interpreter to {path}: {exc}"
            raise SimError(f"{node}: {why}") from None
        finally:
            with contextlib.suppress(OSError):
                tmp.unlink()
    return str(target)
