"""The stand-in nvidia-smi's GPU health: the query fields, ``-q``'s sections, ``nvlink -s``.

Standalone (standard library only, relative imports only: copied with ``nvidia_smi.py``). A node's
``state["health"]`` holds ``{"fabric": bool, "links": int, "consumer": bool, "legacy": bool,
"gpus": {"0": {...}}}``; a GPU's entry overrides its defaults: ``ecc_volatile``,
``ecc_aggregate`` (counts), ``retired_pending``, ``remap_pending``, ``remap_failure`` (bools),
``slowdown`` (a list of ``hw_slowdown``/``hw_thermal_slowdown``/``sw_thermal_slowdown``),
``temperature``, ``power``, ``power_limit``, ``fabric_state``, ``fabric_status``, ``links_down``
(link numbers).

Power: a GPU draws ``IDLE_W`` plus ``W_PER_PCT`` per point of utilisation (as the default table
prints it), up to its limit (``LIMIT_W``), unless its entry says ``power``; an allocation with
``power_w`` (``health_faults.set_workload``: a job wedged at 100 % that draws little) adds that
instead of its utilisation's share.

The formats are the real program's (driver 550), as public samples show them (tests/corpus):
``--query-gpu`` prints ``Yes``/``No``, ``Active``/``Not Active``, counts, ``[N/A]`` where the GPU
has no such thing (a consumer GPU: no ECC, no row remapper; no NVSwitch: no fabric), and
``Field "X" is not a valid field to query.`` for a field the driver does not know
(``legacy``: a driver before 535, without ``clocks_event_reasons.*`` and ``fabric.*``).
``nvlink -s`` lists each GPU's links (``Link 3: <inactive>`` when down), NVML's one line
``NVML: Unable to retrieve NVLink information as all links are inActive`` for a GPU whose links
are all down, and nothing for a GPU without NVLink.
"""

from __future__ import annotations

TYPE_CHECKING = False  # (no typing at run time: see simstate)
if TYPE_CHECKING:
    from typing import Any

REASONS = ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown")
FIELDS = {
    "ecc.errors.uncorrected.volatile.total": "",
    "ecc.errors.uncorrected.aggregate.total": "",
    "retired_pages.pending": "",
    "remapped_rows.pending": "",
    "remapped_rows.failure": "",
    "temperature.gpu": "",
    "power.draw": "W",
    "power.limit": "W",
    "fabric.state": "",
    "fabric.status": "",
    **{f"clocks_event_reasons.{r}": "" for r in REASONS},
}
ALIASES = {f"clocks_throttle_reasons.{r}": f"clocks_event_reasons.{r}" for r in REASONS}
NEW_IN_535 = frozenset(
    {"fabric.state", "fabric.status", *(f"clocks_event_reasons.{r}" for r in REASONS)}
)
LINK_SPEED = "26.562 GB/s"  # an H100's, as nvidia-smi nvlink -s prints it
ALL_INACTIVE = "NVML: Unable to retrieve NVLink information as all links are inActive"
IDLE_W = 70.0
W_PER_PCT = 6.0
LIMIT_W = 700.0  # an H100 SXM's


def unknown_fields(state: dict[str, Any], raw: list[str]) -> str | None:
    """Return the first field this driver does not know among ``raw`` (health ones), or None."""
    legacy = bool(state.get("health", {}).get("legacy"))
    for f in raw:
        if legacy and f in NEW_IN_535:
            return f
    return None


def power_draw(state: dict[str, Any], index: int, limit: float) -> float:
    """Return what GPU ``index`` draws, from its live allocations (see the module's note)."""
    watts, util = IDLE_W, 0
    for a in state.get("allocs", ()):
        if a.get("gpu") != index or a.get("died_at") is not None:
            continue
        if a.get("power_w") is not None:
            watts += float(a["power_w"])
        else:
            util += int(a.get("util", 0))
    return min(limit, watts + W_PER_PCT * min(100, util))


def values(state: dict[str, Any], g: dict[str, Any]) -> dict[str, Any]:
    """Return one GPU's health fields as ``--query-gpu`` prints them."""
    node = state.get("health", {})
    mine = dict(node.get("gpus", {}).get(str(g["index"]), {}))
    limit = float(mine.get("power_limit", LIMIT_W))
    power = mine.get("power")
    drawn = power_draw(state, g["index"], limit) if power is None else float(power)
    consumer = bool(node.get("consumer"))
    na = "[N/A]"
    out: dict[str, Any] = {
        "ecc.errors.uncorrected.volatile.total": na if consumer else mine.get("ecc_volatile", 0),
        "ecc.errors.uncorrected.aggregate.total": na if consumer else mine.get("ecc_aggregate", 0),
        "retired_pages.pending": na if consumer else _yes(mine.get("retired_pending", False)),
        "remapped_rows.pending": "[Not Supported]"
        if consumer
        else _yes(mine.get("remap_pending", False)),
        "remapped_rows.failure": "[Not Supported]"
        if consumer
        else _yes(mine.get("remap_failure", False)),
        "temperature.gpu": mine.get("temperature", 34),
        "power.draw": f"{drawn:.2f}",
        "power.limit": f"{limit:.2f}",
        "fabric.state": mine.get("fabric_state", "Completed") if node.get("fabric") else na,
        "fabric.status": mine.get("fabric_status", "Success") if node.get("fabric") else na,
    }
    slow = set(mine.get("slowdown", ()))
    for r in REASONS:
        out[f"clocks_event_reasons.{r}"] = "Active" if r in slow else "Not Active"
    return out


def _yes(v: Any) -> str:
    return "Yes" if v else "No"


def nvlink_status(state: dict[str, Any], gpus: list[dict[str, Any]]) -> str:
    """Render ``nvidia-smi nvlink -s``: each GPU and its links."""
    node = state.get("health", {})
    n = int(node.get("links", 0))
    out = []
    for g in gpus:
        out.append(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})")
        down = set(node.get("gpus", {}).get(str(g["index"]), {}).get("links_down", ()))
        if n and down >= set(range(n)):  # NVML's one line (leptonai/gpud#1085)
            out.append(ALL_INACTIVE)
            continue
        for k in range(n):
            out.append(f"\t Link {k}: {'<inactive>' if k in down else LINK_SPEED}")
    return "".join(line + "\n" for line in out)


def query_sections(state: dict[str, Any], gpus: list[dict[str, Any]]) -> str:
    """Render ``nvidia-smi -q``'s ECC, retired pages, remapped rows and Fabric sections."""
    out = [
        "",
        "==============NVSMI LOG==============",
        "",
        f"{'Driver Version':<42}: {state['driver_version']}",
        f"{'Attached GPUs':<42}: {len(state['gpus'])}",
    ]
    for g in gpus:
        v = values(state, g)
        out += [f"GPU {g['bus_id']}", f"    {'Product Name':<38}: {g['name']}"]
        out += _q_memory(v)
        st, ss = (str(v["fabric.state"]), str(v["fabric.status"]))
        out += ["    Fabric", _kv(8, "State", st.strip("[]")), _kv(8, "Status", ss.strip("[]"))]
    return "".join(line + "\n" for line in out)


def _kv(indent: int, key: str, value: Any) -> str:
    return f"{' ' * indent}{key:<{42 - indent}}: {value}"


def _q_memory(v: dict[str, Any]) -> list[str]:
    def bare(x: Any) -> str:
        return str(x).strip("[]")

    vol, agg = (
        bare(v["ecc.errors.uncorrected.volatile.total"]),
        bare(v["ecc.errors.uncorrected.aggregate.total"]),
    )
    return [
        "    ECC Errors",
        "        Volatile",
        _kv(12, "DRAM Uncorrectable", vol),
        "        Aggregate",
        _kv(12, "DRAM Uncorrectable", agg),
        "    Retired Pages",
        _kv(8, "Pending Page Blacklist", bare(v["retired_pages.pending"])),
        "    Remapped Rows",
        _kv(8, "Pending", bare(v["remapped_rows.pending"])),
        _kv(8, "Remapping Failure Occurred", bare(v["remapped_rows.failure"])),
    ]


def applied(state: dict[str, Any], index: int) -> None:
    """A GPU reset applies what waits for one: a pending row remap or page retirement."""
    mine = state.get("health", {}).get("gpus", {}).get(str(index), {})
    mine.pop("remap_pending", None)
    mine.pop("retired_pending", None)
