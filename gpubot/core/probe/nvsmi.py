"""Build ``nvidia-smi`` queries and parse their CSV answers, strictly.

A line that cannot be parsed raises ``ParseError`` carrying the raw line: a wrong table is worse
than none. ``[N/A]``, ``[Not Supported]`` and similar placeholders become ``None``, never ``0``.

Formats (``--format=csv``; ``noheader`` drops the first line, ``nounits`` drops `` MiB``/`` %``)::

    index, uuid, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%]
    0, GPU-5f3c..., NVIDIA H200, 1024 MiB, 143771 MiB, 37 %

    pid, gpu_uuid, used_gpu_memory [MiB]
    4242, GPU-5f3c..., 1024 MiB

``process_name`` is never asked for: it is the process's own argv[0], which it can rewrite
(newlines included); the probe reads names from ``/proc`` and escapes them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpubot.core.models import ComputeApp, GpuInfo
from gpubot.core.text import cut
from gpubot.errors import ParseError, ProbeError, SmiFailed, SmiMissing

GPU_FIELDS = (
    "index",
    "uuid",
    "pci.bus_id",
    "mig.mode.current",
    "name",
    "memory.used",
    "memory.total",
    "utilization.gpu",
)
APP_FIELDS = ("pid", "gpu_uuid", "used_memory")

# What nvidia-smi prints in place of a value it cannot give (NVML error strings in brackets).
UNAVAILABLE = frozenset(
    {
        "N/A",
        "[N/A]",
        "[Not Supported]",
        "[Not Available]",
        "[Not Found]",
        "[Insufficient Permissions]",
        "[Unknown Error]",
    }
)

_BUS = re.compile(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])")
_APP_HEADER = ("pid", "gpu_uuid", "used_gpu_memory")
_UNIT = re.compile(r"\s*\[[^\]]*\]$")  # " [MiB]" after a header name
_UUID = re.compile(r"(?:GPU|MIG)-[0-9A-Za-z][0-9A-Za-z/-]*")
_INT = re.compile(r"[0-9]{1,12}")
_NO_PROCESSES = "No running processes found"
_BUS_TEXT = r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]"
# A GPU that fell off the bus; the other GPUs are still listed. Seen in three shapes (driver
# versions differ): "...for GPU0000:CB:00.0: Unknown Error", "...for GPU1: 0000:34:00.0: Unknown
# Error" and "...for GPU1: Unknown Error" (public bug reports and monitoring code quoting them).
_UNABLE = "Unable to determine the device handle for GPU ?"
_LOST = (
    re.compile(rf"{_UNABLE}(?P<bus>{_BUS_TEXT}): (?P<why>.*)"),
    re.compile(rf"{_UNABLE}(?P<index>\d+): (?P<bus>{_BUS_TEXT}): (?P<why>.*)"),
    re.compile(rf"{_UNABLE}(?P<index>\d+): (?P<why>.*)"),
)
_INFOROM = re.compile(rf"WARNING: infoROM is corrupted at gpu (?P<bus>{_BUS_TEXT})")
_NOTE_STARTS = (_UNABLE.removesuffix(" ?"), "WARNING: infoROM")  # how every note line starts
# nvidia-smi(1), RETURN VALUE: 14 "infoROM is corrupted", 15 "GPU has fallen off the bus":
# with these the rows of the GPUs that still answer are printed and used.
USABLE_EXIT = (0, 14, 15)
# Bracketed values that say something about the GPU, not just "no value here".
_PLACEHOLDER_FLAGS = {
    "[GPU is lost]": "lost",
    "[GPU requires reset]": "requires-reset",
    "[Unknown Error]": "unknown-error",
    "[No data]": "no-data",
    "[Timeout]": "timeout",
}
_BRACKETED = re.compile(r"\[[^\]\n]{1,60}\]")
_HUNG = (124, 137)  # timeout(1): 124 after TERM, 128+9 when it had to KILL


def gpu_query_argv(smi: str, indices: Sequence[int] | None = None) -> list[str]:
    """Return the argv of the GPU query (``csv,noheader,nounits``), optionally for some GPUs."""
    argv = [smi, f"--query-gpu={','.join(GPU_FIELDS)}", "--format=csv,noheader,nounits"]
    if indices is not None:
        if not indices or any(i < 0 for i in indices):
            raise ValueError(f"GPU indices must be non-negative and non-empty: {list(indices)}")
        argv += ["-i", ",".join(str(int(i)) for i in indices)]
    return argv


def apps_query_argv(smi: str) -> list[str]:
    """Return the argv of the compute-apps query (``csv,noheader,nounits``)."""
    return [smi, f"--query-compute-apps={','.join(APP_FIELDS)}", "--format=csv,noheader,nounits"]


@dataclass(frozen=True)
class SmiNotes:
    """What nvidia-smi said beside its table: lost GPUs and warnings, one line each."""

    lost: tuple[tuple[int | None, str | None, str], ...] = ()  # (index, bus id, reason)
    warnings: tuple[tuple[str, str], ...] = ()  # (bus id, line)

    def lines(self) -> tuple[str, ...]:
        """Return each note as one line for a person."""
        lost = tuple(
            f"GPU {'?' if i is None else i}{f' ({b})' if b else ''} is lost ({why}): it needs a "
            "GPU reset or a reboot"
            for i, b, why in self.lost
        )
        return lost + tuple(line for _, line in self.warnings)


def take_notes(text: str) -> tuple[str, SmiNotes]:
    """Split nvidia-smi's lost-GPU and warning lines from ``text``; return the rest and them."""
    rest: list[str] = []
    lost: list[tuple[int | None, str | None, str]] = []
    warnings: list[tuple[str, str]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith(_NOTE_STARTS):  # a row: the usual line, no pattern tried
            rest.append(raw)
            continue
        m = next((m for p in _LOST if (m := p.fullmatch(line))), None)
        if m is not None:
            d = m.groupdict()
            index = int(d["index"]) if d.get("index") else None
            lost.append((index, d.get("bus"), d["why"].strip() or "Unknown Error"))
            continue
        w = _INFOROM.fullmatch(line)
        if w is not None:
            warnings.append((w["bus"], line))
            continue
        rest.append(raw)
    return "\n".join(rest) + "\n", SmiNotes(tuple(lost), tuple(warnings))


def parse_gpu_answer(
    node: str, status: int, out: str, err: str, *, timeout_s: float | None = None
) -> tuple[tuple[GpuInfo, ...], SmiNotes]:
    """Parse the GPU query's answer; a lost GPU with a known index gets a row flagged ``lost``,
    values unknown, and one an infoROM warning names is flagged ``warning``."""
    body, notes = take_notes(out)
    _, err_notes = take_notes(err)
    notes = SmiNotes(notes.lost + err_notes.lost, notes.warnings + err_notes.warnings)
    rows: list[GpuInfo] = []
    error = smi_error(node, status, err + "\n" + out, timeout_s=timeout_s)
    if status in USABLE_EXIT:
        try:
            rows = list(parse_gpus(body))
        except ParseError:
            if error is None:  # exit 0 with a table that does not parse
                raise
    if error is not None and not (rows or notes.lost):
        raise error
    known = {g.index for g in rows}
    for index, bus, _ in notes.lost:
        if index is not None and index not in known:
            rows.append(GpuInfo(index, "", "?", None, None, None, bus, None, ("lost",)))
            known.add(index)
    warned = {normal_bus_id(b) for b, _ in notes.warnings}
    rows = [
        replace(g, flags=(*g.flags, "warning"))
        if g.bus_id and normal_bus_id(g.bus_id) in warned
        else g
        for g in rows
    ]
    return tuple(sorted(rows, key=lambda g: g.index)), notes


def parse_apps_answer(
    node: str, status: int, out: str, err: str, *, timeout_s: float | None = None
) -> tuple[ComputeApp, ...]:
    """Parse the compute-apps answer; lost-GPU and warning lines are the GPU query's to tell."""
    body, _ = take_notes(out)
    if status not in USABLE_EXIT:  # 14/15 with no rows: no process (the GPU query tells why)
        error = smi_error(node, status, err + "\n" + out, timeout_s=timeout_s)
        assert error is not None
        raise error
    return parse_apps(body)


def parse_gpus(text: str) -> tuple[GpuInfo, ...]:
    """Parse ``--query-gpu`` output (with or without header and units); raise ParseError."""
    rows: list[GpuInfo] = []
    for line in _data_lines(text, (GPU_FIELDS,)):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 8:
            raise ParseError("nvidia-smi GPU line", line)
        # A name may contain a comma: take four fields from the left, three from the right.
        index, uuid, bus, mig = parts[0], parts[1], parts[2], parts[3]
        name = ", ".join(parts[4:-3])
        used, total, util = parts[-3:]
        if not _INT.fullmatch(index) or not _UUID.fullmatch(uuid) or not name:
            raise ParseError("nvidia-smi GPU line", line)
        if not _BUS.fullmatch(bus) and not _BRACKETED.fullmatch(bus):
            raise ParseError("nvidia-smi GPU line (bus id)", line)
        if mig not in ("Enabled", "Disabled") and mig not in UNAVAILABLE:
            raise ParseError("nvidia-smi GPU line (MIG mode)", line)
        flags = tuple(
            dict.fromkeys(f for v in (used, total, util, bus) if (f := _PLACEHOLDER_FLAGS.get(v)))
        )
        if mig == "Enabled":  # in instances: a reset lists them all, gpu-reset wants all idle
            flags = (*flags, "mig")
        rows.append(
            GpuInfo(
                index=int(index),
                uuid=uuid,
                name=name,
                memory_used_mib=_number(used, "MiB", line, "nvidia-smi GPU line"),
                memory_total_mib=_number(total, "MiB", line, "nvidia-smi GPU line"),
                utilization_pct=_number(util, "%", line, "nvidia-smi GPU line"),
                bus_id=bus if _BUS.fullmatch(bus) else None,
                flags=flags,
            )
        )
    if len({g.index for g in rows}) != len(rows):
        raise ParseError("nvidia-smi GPU table (duplicate index)", text.strip()[:200])
    return tuple(rows)


def normal_bus_id(bus: str) -> str | None:
    """Return nvidia-smi's ``00000000:C1:00.0`` as the driver's /proc folder's ``0000:c1:00.0``."""
    m = _BUS.fullmatch(bus)
    if m is None:
        return None
    return f"{int(m[1], 16):04x}:{m[2].lower()}:{m[3].lower()}.{m[4]}"


def parse_apps(text: str) -> tuple[ComputeApp, ...]:
    """Parse ``--query-compute-apps=pid,gpu_uuid,used_memory`` output; raise ParseError."""
    lines = _data_lines(text, (_APP_HEADER, APP_FIELDS))
    if lines == [_NO_PROCESSES]:  # older drivers say so instead of printing nothing
        return ()
    rows: list[ComputeApp] = []
    for line in lines:
        parts = line.split(",")
        if len(parts) != 3:
            raise ParseError("nvidia-smi compute-apps line", line)
        pid, uuid, used = (p.strip() for p in parts)
        if not _INT.fullmatch(pid) or int(pid) == 0 or not _UUID.fullmatch(uuid):
            raise ParseError("nvidia-smi compute-apps line", line)
        rows.append(
            ComputeApp(
                pid=int(pid),
                gpu_uuid=uuid,
                used_memory_mib=_number(used, "MiB", line, "nvidia-smi compute-apps line"),
            )
        )
    return tuple(rows)


def smi_error(
    node: str, exit_status: int, output: str, *, timeout_s: float | None = None
) -> ProbeError | None:
    """Return the error an nvidia-smi exit status means on ``node``, or None when it succeeded."""
    if exit_status == 0:
        return None
    if exit_status == 127:
        return SmiMissing(node, "nvidia-smi not found (is the NVIDIA driver installed?)")
    if exit_status in _HUNG:
        within = f" in {timeout_s:g}s" if timeout_s is not None else ""
        return SmiFailed(node, f"nvidia-smi hung: no answer{within}")
    line = first_meaningful_line(output)
    detail = f": {line}" if line else ""
    return SmiFailed(node, f"nvidia-smi failed (exit {exit_status}){detail}")


def first_meaningful_line(output: str, limit: int = 200) -> str:
    """Return the first non-blank line of ``output``, shortened to ``limit`` characters."""
    for raw in output.splitlines():
        line = " ".join(raw.split())
        if line:
            return cut(line, limit)
    return ""


def _data_lines(text: str, headers: tuple[tuple[str, ...], ...]) -> list[str]:
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    if lines and _header_of(lines[0]) in headers:
        lines = lines[1:]
    return lines


def _header_of(line: str) -> tuple[str, ...]:
    return tuple(_UNIT.sub("", p.strip()) for p in line.split(","))


def _number(value: str, unit: str, line: str, what: str) -> int | None:
    """Parse ``"1024"``, ``"1024 MiB"`` or ``"37 %"``; any bracketed value is None, never 0."""
    if value in UNAVAILABLE or _BRACKETED.fullmatch(value):
        return None
    if value.endswith(unit):
        value = value[: -len(unit)].rstrip()
    if not _INT.fullmatch(value):
        raise ParseError(what, line)
    return int(value)
