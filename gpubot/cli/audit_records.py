"""``audit list [--kind K,…]`` and ``audit show ID`` for records that are not actions.

An action (intent, events, outcome) reads as one row; every other record is one row of its own.
Both ids are a record's seq, so ``audit show`` takes any id the listing printed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TextIO

from gpubot.core.text import cut
from gpubot.core.text_table import table_lines
from gpubot.store import ActionSummary, AuditRecord
from gpubot.store.audit_kinds import Listed, listing_kind

STATUS_KEYS = ("change", "to", "ladder", "alert", "query", "post")  # what a record says happened
NO_STATUS = {"review": "reviewed", "seal": "sealed", "lease": "taken over", "chain": "keyed"}
HIDDEN = {"token", "hash", "mac"}  # payload keys no person reads in a listing row
WHAT_WIDTH = 80


def status_of(rec: AuditRecord) -> str:
    """Return the one word of what a record says happened (``claimed``, ``approved`` …)."""
    data = _data(rec)
    for key in STATUS_KEYS:
        if isinstance(data.get(key), str):
            return str(data[key])
    return NO_STATUS.get(rec.kind, listing_kind(rec))


def gpus_of(rec: AuditRecord) -> list[int]:
    """Return the GPUs a record names (``gpu`` or ``gpus`` in its payload)."""
    data = _data(rec)
    gpus = data.get("gpus", [data["gpu"]] if isinstance(data.get("gpu"), int) else [])
    return [g for g in gpus if isinstance(g, int)] if isinstance(gpus, list) else []


def record_row(rec: AuditRecord) -> dict[str, Any]:
    """Return a listing's JSON row of a record (an action's row is its summary)."""
    return {
        "record": listing_kind(rec),
        "id": rec.seq,
        "kind": listing_kind(rec),
        "status": status_of(rec),
        "started_at": rec.created_at,
        "actor": rec.actor,
        "source": rec.source,
        "node": rec.node,
        "gpus": gpus_of(rec),
        "action_id": rec.action_id,
        "payload": _data(rec),
    }


def print_listing(items: Sequence[Listed], as_json: bool, out: TextIO, empty: str) -> None:
    if as_json:
        rows = [
            {"record": "action", **i.as_dict()} if isinstance(i, ActionSummary) else record_row(i)
            for i in items
        ]
        out.write(json.dumps(rows, indent=2, ensure_ascii=False) + "\n")
        return
    if not items:
        out.write(f"{empty}\n")
        return
    table: list[tuple[str, ...]] = [
        ("ID", "STARTED (UTC)", "KIND", "STATUS", "NODE", "GPUS", "ACTOR", "SOURCE", "WHAT")
    ]
    table += [action_cells(i) if isinstance(i, ActionSummary) else _cells(i) for i in items]
    write_table(table, out)


def write_table(rows: Sequence[Sequence[str]], out: TextIO) -> None:
    out.write("\n".join(table_lines(rows)) + "\n")


def when(moment: datetime | None) -> str:
    """Return a UTC time as the audit's tables show it ("-": none)."""
    return "-" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S")


def show_record(rec: AuditRecord) -> str:
    lines = [
        f"record {rec.seq}: {listing_kind(rec)} ({status_of(rec)}) on {rec.node or '-'}",
        f"  who:      {rec.actor} via {rec.source}",
        f"  time:     {when(rec.time)} UTC",
    ]
    if rec.action_id is not None and rec.action_id != rec.seq:
        lines.append(f"  action:   {rec.action_id} (`gpubot audit show {rec.action_id}`)")
    payload = json.dumps(_data(rec), indent=2, sort_keys=True, ensure_ascii=False)
    lines.append("  payload:  " + payload.replace("\n", "\n            "))
    lines += [f"  prev:     {rec.prev_hash}", f"  hash:     {rec.hash}"]
    return "\n".join(lines) + "\n"


def action_cells(a: ActionSummary, *, kind: bool = True) -> tuple[str, ...]:
    """Return an action's row: id, start, kind (unless ``kind`` is False), status and the rest."""
    gpus = ",".join(map(str, a.gpus)) or "-"
    what = (a.status, a.node or "-", gpus, a.actor, a.source, a.command)
    return (str(a.id), when(a.started_at), *((a.kind,) if kind else ()), *what)


def _cells(rec: AuditRecord) -> tuple[str, ...]:
    data = _data(rec)
    status = status_of(rec)
    what = " ".join(
        f"{k}={_short(v)}"
        for k, v in sorted(data.items())
        if k not in HIDDEN and v not in (None, "", [], {}) and v != status
    )
    what = cut(what, WHAT_WIDTH)
    return (
        str(rec.seq),
        when(rec.time),
        listing_kind(rec),
        status,
        rec.node or "-",
        ",".join(map(str, gpus_of(rec))) or "-",
        rec.actor,
        rec.source,
        what or "-",
    )


def _short(value: Any) -> str:
    return cut(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False), 30)


def _data(rec: AuditRecord) -> dict[str, Any]:
    data = rec.data
    return data if isinstance(data, dict) else {"payload": data}
