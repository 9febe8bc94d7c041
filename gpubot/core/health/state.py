"""GPU health as nvidia-smi says it: memory repair, ECC, the fabric, NVLink, throttling.

Pure. A sweep, never a status (a status stays cheap), runs ``health_argv``'s one exec after the
node's probe answered: its own ``--query-gpu`` (so a field an older driver lacks never costs the
probe's table), ``nvidia-smi nvlink -s`` and a look at the fabric manager's pid file. What it
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

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_COMMON = (
    "index",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.pending",
)
_TAIL = ("temperature.gpu", "power.draw")
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
    ),
    "r460": (*_COMMON, *_REMAP, *(f"clocks_throttle_reasons.{r}" for r in _REASONS), *_TAIL),
    "old": (*_COMMON, *(f"clocks_throttle_reasons.{r}" for r in _REASONS), *_TAIL),
}
FABRIC_MANAGER_PID = "/run/nvidia-fabricmanager/nv-fabricmanager.pid"
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
smi=$1 T=$2 fm=$3
shift 3
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
m end
"""


def health_argv(
    nvidia_smi: str, timeout_s: float, *, sets: Sequence[str] = tuple(FIELD_SETS), fm_pid: str = ""
) -> list[str]:
    """Return the argv of the health exec: ``sets`` (names of ``FIELD_SETS``) tried in order."""
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    if not sets or any(s not in FIELD_SETS for s in sets):
        raise ValueError(f"unknown health field sets: {list(sets)!r}")
    pid = fm_pid or FABRIC_MANAGER_PID
    if not pid.startswith("/"):
        raise ValueError(f"the fabric manager's pid file must be an absolute path: {pid!r}")
    queries = [f"{s}={','.join(FIELD_SETS[s])}" for s in sets]
    return [
        "bash",
        "-c",
        HEALTH_SCRIPT,
        "gpubot-health",
        nvidia_smi,
        f"{timeout_s:g}",
        pid,
        *queries,
    ]


@dataclass(frozen=True)
class Links:
    """One GPU's NVLink links as ``nvidia-smi nvlink -s`` lists them."""

    up: tuple[int, ...] = ()
    down: tuple[int, ...] = ()  # "<inactive>"


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
        if self.links is not None and self.links.down and self.links.up:
            out.append(f"nvlink-down:{len(self.links.down)}")
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
            "fabric_state": self.fabric_state,
            "fabric_status": self.fabric_status,
            "nvlink_down": None if self.links is None else list(self.links.down),
        }


@dataclass(frozen=True)
class NodeHealth:
    """What one node's health exec said."""

    gpus: Mapping[int, GpuHealth] = field(default_factory=dict)
    field_set: str | None = None  # which of FIELD_SETS the driver accepted (None: none)
    fabric_manager: str = "unknown"  # "running (pid N)", "not running", "not the daemon ..."
    notes: tuple[str, ...] = ()  # what could not be read, one line each

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
        return float(v.strip().removesuffix(" W"))
    except ValueError:
        return None


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


def _text(v: str | None) -> str | None:
    return None if v is None or unknown(v) else v.strip()


def parse_nvlink(text: str) -> dict[int, Links]:
    """Parse ``nvidia-smi nvlink -s``: each GPU's links, up (a speed) or down (``<inactive>``).

    A GPU without NVLink lists no link (or the whole answer is one NVML line): it gets none.
    """
    out: dict[int, tuple[list[int], list[int]]] = {}
    gpu: int | None = None
    for line in text.splitlines():
        g = _GPU_LINE.fullmatch(line.rstrip())
        if g is not None:
            gpu = int(g[1])
            out.setdefault(gpu, ([], []))
            continue
        link = _LINK_LINE.fullmatch(line.rstrip())
        if link is not None and gpu is not None:
            down = link[2].strip().lower() == "<inactive>"
            out[gpu][1 if down else 0].append(int(link[1]))
    return {g: Links(tuple(up), tuple(down)) for g, (up, down) in out.items() if up or down}


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
    gpus = {
        i: GpuHealth(**{**_fields(h), "links": links.get(i)}) if i in links else h
        for i, h in gpus.items()
    }
    fm = _fabric_manager(s.get("fm", ([], ""))[0]) if "fm" in s else "unknown"
    return NodeHealth(gpus, set_name, fm, tuple(notes))


def _without_notes(body: str) -> str:
    return "\n".join(
        line
        for line in body.splitlines()
        if not line.startswith(("WARNING: infoROM", "Unable to determine the device handle"))
    )


def _fields(h: GpuHealth) -> dict[str, Any]:
    return {k: getattr(h, k) for k in h.__dataclass_fields__}


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
    if h.links is not None and h.links.down and h.links.up:
        out.append(f"NVLink links down: {', '.join(str(i) for i in h.links.down)}")
    return tuple(out)
