"""Reset readiness of an orphaned GPU: what ``nvidia-smi --gpu-reset`` would touch."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gpubot.core.health.state import health_blockers
from gpubot.core.models import NodeSnapshot

# One exec: topology, MIG and persistence mode of the GPUs, the persistence daemon. Everything
# that varies arrives as a positional argument; sections are opened by "@gpubot <kind> <status>".
# No output holds text a process controls (ps prints PIDs only), so a fixed marker is enough.
READY_SCRIPT = """m() { printf '\\n@gpubot %s\\n' "$*"; }
smi=$1 T=$2 idx=$3
o=$(timeout -k 1 "$T" "$smi" topo -m 2>&1); s=$?
m topo "$s"; printf '%s\\n' "$o"
o=$(timeout -k 1 "$T" "$smi" --query-gpu=index,mig.mode.current,persistence_mode \\
    --format=csv,noheader -i "$idx" 2>&1); s=$?
m modes "$s"; printf '%s\\n' "$o"
o=$(ps -C nvidia-persistenced -o pid= 2>&1); s=$?
m persistenced "$s"; printf '%s\\n' "$o"
m end
"""


def ready_argv(nvidia_smi: str, gpus: Sequence[int], timeout_s: float) -> list[str]:
    """Return the argv that gathers the reset readiness of ``gpus`` (parse with ``readiness``)."""
    if not gpus or any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in gpus):
        raise ValueError(f"GPU indices must be whole numbers >= 0, got {list(gpus)!r}")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    return [
        "sh",
        "-c",
        READY_SCRIPT,
        "gpubot-ready",
        nvidia_smi,
        f"{timeout_s:g}",
        ",".join(str(g) for g in gpus),
    ]


@dataclass(frozen=True)
class Readiness:
    """What a person should know before ``nvidia-smi --gpu-reset`` of one GPU."""

    gpu: int
    processes: tuple[str, ...]  # what still holds the GPU (daemons included)
    persistence_daemon: str  # "running (pid N)", "not running", "unknown"
    nvlink_peers: tuple[int, ...] | None  # None: unknown
    nvlink_note: str  # why unknown
    mig_mode: str | None  # "Enabled", "Disabled", "not supported", None: unknown
    persistence_mode: str | None
    health: tuple[str, ...] = ()  # the GPU's health blockers (core.health.state), one line each

    def lines(self) -> list[str]:
        procs = ", ".join(self.processes) if self.processes else "none"
        if self.nvlink_peers is None:
            peers = f"unknown ({self.nvlink_note})" if self.nvlink_note else "unknown"
        elif self.nvlink_peers:
            peers = "GPU " + ", ".join(str(g) for g in self.nvlink_peers) + " (may reset too)"
        else:
            peers = "none"
        pm = f" (persistence mode {self.persistence_mode})" if self.persistence_mode else ""
        return [
            f"processes on GPU {self.gpu}: {procs}",
            f"persistence daemon: {self.persistence_daemon}{pm}",
            f"NVLink peers: {peers}",
            f"MIG mode: {self.mig_mode or 'unknown'}",
            *(f"health: {line}" for line in self.health),
        ]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def readiness(
    snap: NodeSnapshot | None,
    gpus: Sequence[int],
    output: str | None,
    *,
    why_unknown: str = "",
) -> dict[int, Readiness]:
    """Build the readiness of ``gpus``; ``output`` None leaves what only the node says unknown."""
    sections = _ready_sections(output or "") if output is not None else {}
    topo_status, topo = sections.get("topo", (None, ""))
    peers: dict[int, tuple[int, ...]] | None = None
    note = why_unknown or "not asked"
    if topo_status == 0:
        peers = parse_topo_peers(topo)
        note = "" if peers is not None else "nvidia-smi topo -m gave no GPU topology table"
    elif topo_status is not None:
        note = "nvidia-smi topo -m is not available here"
    modes_status, modes_text = sections.get("modes", (None, ""))
    modes = parse_modes(modes_text) if modes_status == 0 else {}
    pd_status, pd_text = sections.get("persistenced", (None, ""))
    if pd_status == 0:
        pids = [w for w in pd_text.split() if w.isdigit()]
        daemon = f"running (pid {', '.join(pids)})" if pids else "running"
    elif pd_status == 1:
        daemon = "not running"
    else:
        daemon = "unknown"
    out: dict[int, Readiness] = {}
    for g in gpus:
        procs = tuple(
            f"{p.process_name} (pid {p.pid}, {p.user or '?'})"
            for p in (snap.on_gpu(g) if snap is not None else ())
        )
        mig, pm = modes.get(g, (None, None))
        gpu_peers = None if peers is None else peers.get(g, ())
        info = snap.gpu(g) if snap is not None else None
        blockers = health_blockers(info.health if info is not None else None)
        why = note if gpu_peers is None else ""
        out[g] = Readiness(g, procs, daemon, gpu_peers, why, mig, pm, blockers)
    return out


def _ready_sections(text: str) -> dict[str, tuple[int | None, str]]:
    marker = re.compile("\n@gpubot ([^\n]*)\n")
    text = "\n" + text
    found = list(marker.finditer(text))
    out: dict[str, tuple[int | None, str]] = {}
    for m, nxt in zip(found, [*found[1:], None][: len(found)], strict=True):
        words = m[1].split(" ")
        body = text[m.end() : nxt.start() if nxt else len(text)]
        status = int(words[1]) if len(words) > 1 and words[1].isdigit() else None
        out.setdefault(words[0], (status, body))
    return out


_GPU_COL = re.compile(r"GPU(\d+)")


def parse_topo_peers(text: str) -> dict[int, tuple[int, ...]] | None:
    """Return each GPU's NVLink peers from ``nvidia-smi topo -m`` (None: no matrix found)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header: list[str] | None = None
    out: dict[int, tuple[int, ...]] = {}
    for line in lines:
        words = line.split()
        if header is None:
            # The header names the columns; every row has an "X" where a GPU meets itself.
            if words and _GPU_COL.fullmatch(words[0]) and "X" not in words:
                header = []
                for w in words:  # device columns end where "CPU Affinity" begins
                    if w in ("CPU", "NUMA", "GPU") or w.startswith(("CPU", "NUMA")):
                        break
                    header.append(w)
            continue
        if not words or words[0] == "Legend:":
            break
        row = _GPU_COL.fullmatch(words[0])
        if row is None:
            continue
        cells = words[1 : 1 + len(header)]
        peers = []
        for name, cell in zip(header, cells, strict=False):
            col = _GPU_COL.fullmatch(name)
            if col and re.fullmatch(r"NV\d+", cell) and col[1] != row[1]:
                peers.append(int(col[1]))
        out[int(row[1])] = tuple(peers)
    return out if header is not None and out else None


def parse_modes(text: str) -> dict[int, tuple[str | None, str | None]]:
    """Return ``{gpu: (MIG mode, persistence mode)}`` from the readiness query's CSV rows."""
    out: dict[int, tuple[str | None, str | None]] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not parts[0].isdigit():
            continue
        mig = "not supported" if parts[1] in ("[N/A]", "N/A", "[Not Supported]") else parts[1]
        pm = None if parts[2] in ("[N/A]", "N/A", "[Not Supported]") else parts[2]
        out[int(parts[0])] = (mig or None, pm or None)
    return out
