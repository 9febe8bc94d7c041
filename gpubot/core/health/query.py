"""``nvidia-smi -q``'s health sections, read into ``GpuHealth`` (pure).

The sweep asks the CSV query (``core.health.state``); this reads the same facts from ``-q``'s text,
as people paste it into tickets and as public samples keep it (tests/corpus/health): the ECC
Errors, Retired Pages, Remapped Rows, Clocks Event (or Throttle) Reasons and Fabric sections of
one GPU. Sections nest by indentation; ``N/A`` is unknown, never 0 or No.
"""

from __future__ import annotations

from gpubot.core.health.state import GpuHealth, unknown

_PATHS = {
    ("ECC Errors", "Volatile", "DRAM Uncorrectable"): "ecc_volatile",
    ("ECC Errors", "Aggregate", "DRAM Uncorrectable"): "ecc_aggregate",
    ("Retired Pages", "Pending Page Blacklist"): "retired_pending",
    ("Retired Pages", "Pending"): "retired_pending",
    ("Remapped Rows", "Pending"): "remap_pending",
    ("Remapped Rows", "Remapping Failure Occurred"): "remap_failure",
    ("Fabric", "State"): "fabric_state",
    ("Fabric", "Status"): "fabric_status",
}
_REASONS = {
    ("HW Slowdown",): "hw_slowdown",
    ("HW Slowdown", "HW Thermal Slowdown"): "hw_thermal_slowdown",
    ("SW Thermal Slowdown",): "sw_thermal_slowdown",
}
_REASON_SECTIONS = ("Clocks Event Reasons", "Clocks Throttle Reasons")


def parse_q_health(text: str, index: int = 0) -> GpuHealth:
    """Return the health ``-q``'s sections in ``text`` say of one GPU."""
    stack: list[tuple[int, str]] = []
    said: dict[str, str] = {}
    slow: list[str] = []
    for raw in text.splitlines():
        if not raw.strip():
            continue
        depth = len(raw) - len(raw.lstrip(" "))
        key, colon, value = raw.strip().partition(":")
        key = key.strip()
        while stack and stack[-1][0] >= depth:
            stack.pop()
        path = (*(k for _, k in stack), key)
        if not colon:
            stack.append((depth, key))
            continue
        value = value.strip()
        if path[0] in _REASON_SECTIONS and _REASONS.get(path[1:]) and value == "Active":
            slow.append(_REASONS[path[1:]])
        name = _PATHS.get(path)
        if name is not None and not unknown(value):
            said[name] = value
    return GpuHealth(
        index=index,
        ecc_volatile=_int(said.get("ecc_volatile")),
        ecc_aggregate=_int(said.get("ecc_aggregate")),
        retired_pending=_yes(said.get("retired_pending")),
        remap_pending=_yes(said.get("remap_pending")),
        remap_failure=_yes(said.get("remap_failure")),
        slowdown=tuple(
            r for r in ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown") if r in slow
        ),
        fabric_state=said.get("fabric_state"),
        fabric_status=said.get("fabric_status"),
    )


def _int(v: str | None) -> int | None:
    return int(v) if v is not None and v.isdigit() else None


def _yes(v: str | None) -> bool | None:
    return {"Yes": True, "No": False}.get(v or "")
