"""GPU health as nvidia-smi says it: memory repair, ECC, the fabric, NVLink, throttling.

Pure. A sweep, never a status (a status stays cheap), runs ``health_argv``'s one exec after the
node's probe answered: its own ``--query-gpu`` (so a field an older driver lacks never costs the
probe's table), ``nvidia-smi nvlink -s``, a look at the fabric manager's pid file and the
NVIDIA GPUs among the kernel's PCI devices (``core.health.vanished``). What it
means is ``core.health.findings``.

Field sets are tried in order until one is accepted (``Field "X" is not a valid field``: the next
is asked): ``clocks_event_reasons.*`` replaced ``clocks_throttle_reasons.*``, and the ``fabric.*``
and ``remapped_rows.*`` fields are newer than some drivers. ``[N/A]``, ``[Not Supported]``
(consumer GPUs: no ECC, no remapper, no fabric) are unknown values, never an alarm.

Nothing here is text a user controls: nvidia-smi prints no process name in these answers, and the
pid file of the fabric manager is root's (``/run``); the process it names is checked by its name
and owner in ``/proc``, so a user's process called ``nv-fabricmanager`` is not the daemon.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

_COMMON = (
    "index",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.pending",
)
_TAIL = ("temperature.gpu", "power.draw")
_LIMIT = (
    "power.limit",
)  # last in every set: the hung-but-busy check's fallback (core.health.hung)
_REMAP = ("remapped_rows.pending", "remapped_rows.failure")
_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown")
# name -> fields, newest first.
FIELD_SETS: dict[str, tuple[str, ...]] = {
    "r535": (
        *_COMMON,
        *_REMAP,
        *(f"clocks_event_reasons.{r}" for r in _REASONS),
        *_TAIL,
        "fabric.state",
        "fabric.status",
        *_LIMIT,
    ),
    "r460": (
        *_COMMON,
        *_REMAP,
        *(f"clocks_throttle_reasons.{r}" for r in _REASONS),
        *_TAIL,
        *_LIMIT,
    ),
    "old": (*_COMMON, *(f"clocks_throttle_reasons.{r}" for r in _REASONS), *_TAIL, *_LIMIT),
}
FABRIC_MANAGER_PID = "/run/nvidia-fabricmanager/nv-fabricmanager.pid"
PCI_DEVICES = "/sys/bus/pci/devices"
_PCI_NAME = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
REASON_WORDS = {
    "hw_slowdown": "HW slowdown",
    "hw_thermal_slowdown": "HW thermal slowdown",
    "sw_thermal_slowdown": "SW thermal slowdown",
}
_UNKNOWN = re.compile(r"\[[^\]\n]{1,60}\]|N/A|Not Supported|Unknown Error|")
_NOT_IN_FABRIC = frozenset({"Not Supported", "N/A", "[N/A]", "[Not Supported]"})

# One exec. Everything that varies is a positional argument; every marker comes from the script,
# and the bodies are nvidia-smi's answers (no process names). Times are bounded by timeout(1).
HEALTH_SCRIPT = r"""m() { printf '\n@gpubot %s\n' "$*"; }
smi=$1 T=$2 fm=$3 pci=$4
shift 4
n=- s=- o=
for a in "$@"; do
  n=${a%%=*}
  o=$(timeout -k 1 "$T" "$smi" "--query-gpu=${a#*=}" --format=csv,noheader,nounits 2>&1); s=$?
  [[ $s != 0 && $o == *'is not a valid field'* ]] || break
done
m health "$n" "$s"; printf '%s\n' "$o"
o=$(timeout -k 1 "$T" "$smi" nvlink -s 2>&1); s=$?
m nvlink "$s"; printf '%s\n' "$o"
p= c= u=
[[ -f $fm ]] && { IFS= read -r p <"$fm"; } 2>/dev/null
if [[ $p =~ ^[0-9]+$ ]]; then
  { IFS= read -r c <"/proc/$p/comm"; } 2>/dev/null
  while read -r k _ u _; do [[ $k == Uid: ]] && break; u=; done 2>/dev/null <"/proc/$p/status"
fi
case $c in
  nv-fabricmanage*) m fm running "$p" "${u:--}" ;;
  *) if [[ -n $p ]]; then m fm stale; elif [[ -e $fm ]]; then m fm stale; else m fm none; fi ;;
esac
if [[ -d $pci ]]; then
  m pci 0
  for d in "$pci"/*; do
    v= c=
    { IFS= read -r v <"$d/vendor" && IFS= read -r c <"$d/class"; } 2>/dev/null
    [[ $v == 0x10de && ($c == 0x0300* || $c == 0x0302*) ]] && printf '%s\n' "${d##*/}"
  done
else
  m pci 1
fi
m end
"""


def health_argv(
    nvidia_smi: str,
    timeout_s: float,
    *,
    sets: Sequence[str] = tuple(FIELD_SETS),
    fm_pid: str = "",
    pci_dir: str = PCI_DEVICES,
) -> list[str]:
    """Return the argv of the health exec: ``sets`` (names of ``FIELD_SETS``) tried in order;
    ``pci_dir``: the kernel's PCI devices, whose NVIDIA display controllers (vendor 0x10de, class
    0x0300xx VGA or 0x0302xx 3D) are listed (an NVSwitch, a bridge, an audio function are not)."""
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    if not sets or any(s not in FIELD_SETS for s in sets):
        raise ValueError(f"unknown health field sets: {list(sets)!r}")
    pid = fm_pid or FABRIC_MANAGER_PID
    if not pid.startswith("/"):
        raise ValueError(f"the fabric manager's pid file must be an absolute path: {pid!r}")
    if not pci_dir.startswith("/"):
        raise ValueError(f"the PCI devices' folder must be an absolute path: {pci_dir!r}")
    queries = [f"{s}={','.join(FIELD_SETS[s])}" for s in sets]
    return [
        "bash",
        "-c",
        HEALTH_SCRIPT,
        "gpubot-health",
        nvidia_smi,
        f"{timeout_s:g}",
        pid,
        pci_dir,
        *queries,
    ]


@dataclass(frozen=True)
class Links:
    """One GPU's NVLink links as ``nvidia-smi nvlink -s`` lists them, and those it should have up.

    ``nvlink -s`` cannot tell a link that is down from one that is not wired: an H100 PCIe pair
    joined by NVLink bridges lists 18 links each, 6 of them ``<inactive>`` by design (topology
    NV12). Which are wired is ``expected`` (``core.health.nvlink``): the links this GPU has been
    seen with up, or, in an NVSwitch fabric, those its peers of the same model have up. None:
    not known, so no link counts as down.
    """

    up: tuple[int, ...] = ()
    down: tuple[int, ...] = ()  # "<inactive>"
    all_inactive: bool = False  # NVML: "Unable to retrieve NVLink information as all links ..."
    expected: tuple[int, ...] | None = None  # the links that should be up (None: unknown)

    @property
    def missing(self) -> tuple[int, ...]:
        """Return the expected links that are not up now (none while ``expected`` is unknown)."""
        if self.expected is None:
            return ()
        up = set(self.up)
        return tuple(i for i in self.expected if i not in up)


@dataclass(frozen=True)
class GpuHealth:
    """One GPU's health fields (None: the GPU or driver does not say)."""

    index: int
    ecc_volatile: int | None = None  # uncorrectable ECC errors since the driver loaded
    ecc_aggregate: int | None = None  # ... over the GPU's life
    retired_pending: bool | None = None  # a retired page waits for a reset (pre-Ampere)
    remap_pending: bool | None = None  # a remapped row waits for a reset (Ampere and later)
    remap_failure: bool | None = None  # a row remapping has failed: hardware
    slowdown: tuple[str, ...] = ()  # active reasons among REASON_WORDS' keys
    reasons_read: bool = False  # the driver said Active/Not Active for the reasons
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None  # the enforced software limit (``power.limit``)
    fabric_state: str | None = None  # None: not in an NVSwitch fabric (or not said)
    fabric_status: str | None = None
    links: Links | None = None  # None: nvlink -s said nothing of this GPU
    fabric_manager: str | None = None  # in a fabric: whether its manager runs (NodeHealth's)

    @property
    def fabric_ready(self) -> bool | None:
        """Whether the GPU's fabric registration completed with success (None: no fabric)."""
        if self.fabric_state is None:
            return None
        return self.fabric_state == "Completed" and self.fabric_status in (None, "Success")

    def flags(self) -> tuple[str, ...]:
        """Return the health flags shown beside the GPU in every table."""
        out: list[str] = []
        if self.remap_pending or self.retired_pending:
            out.append("memory-repair-pending")
        if self.remap_failure:
            out.append("remap-failed")
        if self.ecc_volatile:
            out.append(f"ecc-uncorrected:{self.ecc_volatile}")
        if self.fabric_ready is False:
            out.append("fabric-not-ready")
        if self.links is not None and self.links.missing:
            out.append(f"nvlink-down:{len(self.links.missing)}")
        out += [f"throttled:{r.replace('_', '-')}" for r in self.slowdown]
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready form."""
        return {
            "ecc_uncorrected_volatile": self.ecc_volatile,
            "ecc_uncorrected_aggregate": self.ecc_aggregate,
            "retired_pages_pending": self.retired_pending,
            "remapped_rows_pending": self.remap_pending,
            "remapped_rows_failure": self.remap_failure,
            "throttled": list(self.slowdown),
            "temperature_c": self.temperature_c,
            "power_w": self.power_w,
            "power_limit_w": self.power_limit_w,
            "fabric_state": self.fabric_state,
            "fabric_status": self.fabric_status,
            "nvlink_down": None if self.links is None else list(self.links.missing),
            "nvlink_inactive": None if self.links is None else list(self.links.down),
            "nvlink_all_inactive": None if self.links is None else self.links.all_inactive,
            "nvlink_expected": None
            if self.links is None or self.links.expected is None
            else list(self.links.expected),
        }


@dataclass(frozen=True)
class NodeHealth:
    """What one node's health exec said."""

    gpus: Mapping[int, GpuHealth] = field(default_factory=dict)
    field_set: str | None = None  # which of FIELD_SETS the driver accepted (None: none)
    fabric_manager: str = "unknown"  # "running (pid N)", "not running", "not the daemon ..."
    notes: tuple[str, ...] = ()  # what could not be read, one line each
    # The NVIDIA GPUs the kernel sees on PCI (sysfs bus ids, "0000:2a:00.0"); None: not read.
    pci: tuple[str, ...] | None = None

    @property
    def in_fabric(self) -> bool:
        """Whether any GPU of the node is part of an NVSwitch fabric."""
        return any(g.fabric_state is not None for g in self.gpus.values())


def _sections(text: str) -> dict[str, tuple[list[str], str]]:
    marker = re.compile("\n@gpubot ([^\n]*)\n")
    text = "\n" + text
    found = list(marker.finditer(text))
    out: dict[str, tuple[list[str], str]] = {}
    for i, m in enumerate(found):
        words = m[1].split(" ")
        end = found[i + 1].start() if i + 1 < len(found) else len(text)
        out.setdefault(words[0], (words[1:], text[m.end() : end]))
    return out


def unknown(value: str) -> bool:
    """Whether ``value`` is nvidia-smi's way of saying it has none (``[N/A]`` ...)."""
    return bool(_UNKNOWN.fullmatch(value.strip()))


def _count(v: str) -> int | None:
    v = v.strip()
    return int(v) if v.isdigit() else None


def _yes(v: str) -> bool | None:
    """``Yes``/``No`` (or a count: remapped rows pending print 0/1 on some drivers)."""
    v = v.strip()
    if v in ("Yes", "Active"):
        return True
    if v in ("No", "Not Active"):
        return False
    return int(v) > 0 if v.isdigit() else None


def _float(v: str) -> float | None:
    try:
        x = float(v.strip().removesuffix(" W"))
    except ValueError:
        return None
    return x if math.isfinite(x) and x >= 0 else None


def parse_health_rows(set_name: str, text: str) -> tuple[dict[int, GpuHealth], tuple[str, ...]]:
    """Parse the health query's CSV rows (``noheader,nounits``) of field set ``set_name``."""
    names = FIELD_SETS[set_name]
    out: dict[int, GpuHealth] = {}
    bad = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(names) or not parts[0].isdigit():
            bad += 1
            continue
        v = dict(zip(names, parts, strict=True))
        said = {
            r: x
            for p in _REASON_PREFIXES
            for r in _REASONS
            if (x := _yes(v.get(f"{p}.{r}", ""))) is not None
        }
        reasons = tuple(r for r in _REASONS if said.get(r))
        state = v.get("fabric.state")
        out[int(parts[0])] = GpuHealth(
            index=int(parts[0]),
            ecc_volatile=_count(v["ecc.errors.uncorrected.volatile.total"]),
            ecc_aggregate=_count(v["ecc.errors.uncorrected.aggregate.total"]),
            retired_pending=_yes(v["retired_pages.pending"]),
            remap_pending=_yes(v.get("remapped_rows.pending", "")),
            remap_failure=_yes(v.get("remapped_rows.failure", "")),
            slowdown=reasons,
            reasons_read=bool(said),
            temperature_c=_count(v["temperature.gpu"]),
            power_w=_float(v["power.draw"]),
            power_limit_w=_float(v["power.limit"]),
            fabric_state=None
            if state is None or state in _NOT_IN_FABRIC or unknown(state)
            else state,
            fabric_status=_text(v.get("fabric.status")),
        )
    notes = (f"{bad} health row(s) could not be read",) if bad else ()
    return out, notes


_REASON_PREFIXES = ("clocks_event_reasons", "clocks_throttle_reasons")
_GPU_LINE = re.compile(r"GPU (\d+): .*")
_LINK_LINE = re.compile(r"\s+Link (\d+): (.+)")
# NVML's answer for a GPU whose links are all down (leptonai/gpud#1085; spelled "Nvlink" and
# without the space in NVIDIA/open-gpu-kernel-modules#1150's title).
_ALL_INACTIVE = re.compile(
    r"\s*NVML: ?Unable to retrieve NVLink information as all links are inactive\.?\s*", re.I
)


def _text(v: str | None) -> str | None:
    return None if v is None or unknown(v) else v.strip()


def parse_nvlink(text: str) -> dict[int, Links]:
    """Parse ``nvidia-smi nvlink -s``: each GPU's links, up (a speed) or down (``<inactive>``).

    A GPU whose links are all down is NVML's one line under its own (``all_inactive``). A GPU
    without NVLink lists no link: it gets none. Whether a link that is not up should be is not
    said here (``Links.expected``).
    """
    out: dict[int, tuple[list[int], list[int]]] = {}
    none_up: set[int] = set()
    gpu: int | None = None
    for line in text.splitlines():
        g = _GPU_LINE.fullmatch(line.rstrip())
        if g is not None:
            gpu = int(g[1])
            out.setdefault(gpu, ([], []))
            continue
        if gpu is not None and _ALL_INACTIVE.fullmatch(line):
            none_up.add(gpu)
            continue
        link = _LINK_LINE.fullmatch(line.rstrip())
        if link is not None and gpu is not None:
            down = link[2].strip().lower() == "<inactive>"
            out[gpu][1 if down else 0].append(int(link[1]))
    return {
        g: Links(tuple(up), tuple(down), all_inactive=g in none_up and not up)
        for g, (up, down) in out.items()
        if up or down or g in none_up
    }


def _fabric_manager(words: list[str]) -> str:
    if not words:
        return "unknown"
    if words[0] == "running" and len(words) >= 3:
        pid, uid = words[1], words[2]
        if uid != "0":  # a process of a user named like the daemon is not the daemon
            return f"not running (pid {pid} is named like it but runs as uid {uid})"
        return f"running (pid {pid})"
    if words[0] == "stale":
        return "not running (stale pid file)"
    return "not running" if words[0] == "none" else "unknown"


def parse_health(output: str | None, *, why_unknown: str = "") -> NodeHealth:
    """Build a node's health from the health exec's output (None: it could not run)."""
    if output is None:
        return NodeHealth(notes=(f"health not read: {why_unknown or 'no answer'}",))
    s = _sections(output)
    notes: list[str] = []
    words, body = s.get("health", ([], ""))
    set_name = words[0] if words and words[0] in FIELD_SETS else None
    gpus: dict[int, GpuHealth] = {}
    if set_name is not None and words[1:2] in (["0"], ["14"], ["15"]):
        # 14, 15 (nvidia-smi(1)): an infoROM warning, a GPU lost; the others' rows still count
        gpus, bad = parse_health_rows(set_name, _without_notes(body))
        notes += bad
    else:
        why = body.strip().splitlines()[0][:160] if body.strip() else "no answer"
        notes.append(f"health query failed: {why}")
        set_name = None
    lwords, lbody = s.get("nvlink", ([], ""))
    links = parse_nvlink(lbody) if lwords[:1] == ["0"] else {}
    gpus = {i: replace(h, links=links[i]) if i in links else h for i, h in gpus.items()}
    fm = _fabric_manager(s.get("fm", ([], ""))[0]) if "fm" in s else "unknown"
    pwords, pbody = s.get("pci", ([], ""))
    pci = None
    if pwords[:1] == ["0"]:
        pci = tuple(sorted({b for b in pbody.split() if _PCI_NAME.fullmatch(b)}))
    elif pwords[:1] == ["1"]:
        notes.append("the kernel's PCI devices not read: no such folder")
    return NodeHealth(gpus, set_name, fm, tuple(notes), pci)


def _without_notes(body: str) -> str:
    return "\n".join(
        line
        for line in body.splitlines()
        if not line.startswith(("WARNING: infoROM", "Unable to determine the device handle"))
    )


def health_blockers(h: GpuHealth | None) -> tuple[str, ...]:
    """Return what a GPU's health says before ``nvidia-smi --gpu-reset`` of it (readiness)."""
    if h is None:
        return ()
    out: list[str] = []
    if h.remap_failure:
        out.append("a row remapping failed: a reset will not repair its memory (hardware)")
    if h.remap_pending or h.retired_pending:
        out.append("memory repair pending: a reset applies it")
    if h.fabric_ready is False:
        out.append(f"NVSwitch fabric not ready ({h.fabric_state}, {h.fabric_status or '?'})")
    if h.fabric_manager is not None and not h.fabric_manager.startswith("running"):
        out.append(
            f"fabric manager {h.fabric_manager}: on an NVSwitch box the GPU may not rejoin the "
            "fabric after a reset until it runs"
        )
    if h.links is not None and h.links.missing:
        out.append(f"NVLink links down: {', '.join(str(i) for i in h.links.missing)}")
    return tuple(out)
