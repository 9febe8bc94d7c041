"""Build ``nvidia-smi`` queries and parse their CSV answers, strictly.

A line that cannot be parsed raises ``ParseError`` carrying the raw line: a wrong table is worse
than none. ``[N/A]``, ``[Not Supported]`` and similar placeholders become ``None``, never ``0``.

Formats (``--format=csv``; ``noheader`` drops the first line, ``nounits`` drops `` MiB``/`` %``)::

    index, uuid, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%]
    0, GPU-5f3c..., NVIDIA H200, 1024 MiB, 143771 MiB, 37 %

    pid, gpu_uuid, used_gpu_memory [MiB]
    4242, GPU-5f3c..., 1024 MiB

With no compute processes the apps query prints only its header (nothing with ``noheader``).
``process_name`` is never asked for: NVML reports the process's own argv[0], which the process can
rewrite at run time (newlines included); the probe reads names from ``/proc`` and escapes them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gpubot.core.models import ComputeApp, GpuInfo
from gpubot.errors import ParseError, ProbeError, SmiFailed, SmiMissing

GPU_FIELDS = ("index", "uuid", "name", "memory.used", "memory.total", "utilization.gpu")
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

_GPU_HEADER = ("index", "uuid", "name", "memory.used", "memory.total", "utilization.gpu")
_APP_HEADER = ("pid", "gpu_uuid", "used_gpu_memory")
_APP_HEADER_ALT = ("pid", "gpu_uuid", "used_memory")
_UNIT = re.compile(r"\s*\[[^\]]*\]$")  # " [MiB]" after a header name
_UUID = re.compile(r"(?:GPU|MIG)-[0-9A-Za-z][0-9A-Za-z/-]*")
_INT = re.compile(r"[0-9]{1,12}")
_NO_PROCESSES = "No running processes found"
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


def parse_gpus(text: str) -> tuple[GpuInfo, ...]:
    """Parse ``--query-gpu`` output (with or without header and units); raise ParseError."""
    rows: list[GpuInfo] = []
    for line in _data_lines(text, (_GPU_HEADER,)):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 6:
            raise ParseError("nvidia-smi GPU line", line)
        # A name may contain a comma: take two fields from the left, three from the right.
        index, uuid = parts[0], parts[1]
        name = ", ".join(parts[2:-3])
        used, total, util = parts[-3:]
        if not _INT.fullmatch(index) or not _UUID.fullmatch(uuid) or not name:
            raise ParseError("nvidia-smi GPU line", line)
        rows.append(
            GpuInfo(
                index=int(index),
                uuid=uuid,
                name=name,
                memory_used_mib=_number(used, "MiB", line, "nvidia-smi GPU line"),
                memory_total_mib=_number(total, "MiB", line, "nvidia-smi GPU line"),
                utilization_pct=_number(util, "%", line, "nvidia-smi GPU line"),
            )
        )
    if len({g.index for g in rows}) != len(rows):
        raise ParseError("nvidia-smi GPU table (duplicate index)", text.strip()[:200])
    return tuple(rows)


def parse_apps(text: str) -> tuple[ComputeApp, ...]:
    """Parse ``--query-compute-apps=pid,gpu_uuid,used_memory`` output; raise ParseError."""
    lines = _data_lines(text, (_APP_HEADER, _APP_HEADER_ALT))
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
            return line if len(line) <= limit else line[: limit - 1] + "…"
    return ""


def _data_lines(text: str, headers: tuple[tuple[str, ...], ...]) -> list[str]:
    """Return the non-blank lines of ``text`` without a leading CSV header."""
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line]
    if lines and _header_of(lines[0]) in headers:
        lines = lines[1:]
    return lines


def _header_of(line: str) -> tuple[str, ...]:
    return tuple(_UNIT.sub("", p.strip()) for p in line.split(","))


def _number(value: str, unit: str, line: str, what: str) -> int | None:
    """Parse ``"1024"``, ``"1024 MiB"``, ``"37 %"`` or a placeholder (None); raise ParseError."""
    if value in UNAVAILABLE:
        return None
    if value.endswith(unit):
        value = value[: -len(unit)].rstrip()
    if not _INT.fullmatch(value):
        raise ParseError(what, line)
    return int(value)
