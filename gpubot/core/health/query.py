"""``nvidia-smi -q``'s health sections, read into ``GpuHealth`` (pure).

The sweep asks the CSV query (``core.health.state``); this reads the same facts from ``-q``'s text,
as people paste it into tickets and as public samples keep it (tests/corpus/health): the ECC
Errors, Retired Pages, Remapped Rows, Clocks Event (or Throttle) Reasons and Fabric sections of
one GPU. Sections nest by indentation; ``N/A`` is unknown, never 0 or No.
"""

from __future__ import annotations

from gpubot.core.health.state import GpuHealth, unknown

# Uncorrectable counts are summed over the section's "... Uncorrectable ..." entries (DRAM and
# SRAM, the SRAM split into Parity and SEC-DED on newer drivers), as the CSV query's
# ``ecc.errors.uncorrected.volatile.total`` is: an SRAM error is as fatal to a job as a DRAM one.
_ECC_SUMS: dict[tuple[str, ...], str] = {
    ("ECC Errors", "Volatile"): "ecc_volatile",
    ("ECC Errors", "Aggregate"): "ecc_aggregate",
}
_PATHS: dict[tuple[str, ...], str] = {
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
    sums: dict[str, int] = {}
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
        total = _ECC_SUMS.get(path[:2])
        if total is not None and len(path) == 3 and "Uncorrectable" in key and value.isdigit():
            sums[total] = sums.get(total, 0) + int(value)
    return GpuHealth(
        index=index,
        ecc_volatile=sums.get("ecc_volatile"),
        ecc_aggregate=sums.get("ecc_aggregate"),
        retired_pending=_yes(said.get("retired_pending")),
        remap_pending=_yes(said.get("remap_pending")),
        remap_failure=_yes(said.get("remap_failure")),
        slowdown=tuple(
            r for r in ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown") if r in slow
        ),
        fabric_state=said.get("fabric_state"),
        fabric_status=said.get("fabric_status"),
    )


def _yes(v: str | None) -> bool | None:
    return {"Yes": True, "No": False}.get(v or "")
