"""``audit list --kind``: the kinds of record a person can list, and their indexed queries.

A listing kind is a stored ``kind`` named for a person, plus three that split a stored kind by
the first key of its canonical payload: ``reset``, ``drain`` and ``digest``. Each stored kind is
one query through the ``(kind, seq)`` or ``(node, kind, seq)`` index, newest first and cut at the
limit, and the answers are merged by seq: a ``kind IN (…)`` query would let a database walk the
primary key backwards over the whole log looking for enough rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, Select, and_, not_, or_, select

from gpubot.store import audit
from gpubot.store.audit_list import narrow, summaries_query
from gpubot.store.engine import Part, reads
from gpubot.store.records import ActionSummary, AuditRecord
from gpubot.store.tables import audit_log

GPUBOT = "gpubot"  # the actor of gpubot's own records (posts, expiries, offers, seals)


@dataclass(frozen=True)
class Kind:
    """One listing kind: the stored kind it reads, and a payload prefix that narrows it."""

    name: str
    stored: str
    about: str
    prefixes: tuple[str, ...] = ()  # payload starts with one of these (empty: any)
    not_prefixes: tuple[str, ...] = ()  # payload starts with none of these


_DIGEST = ('{"alert":"digest ',)
KINDS = (
    Kind(
        "action",
        "intent",
        "every action: resets, GPU resets, drains, diagnostics, refused requests",
    ),
    Kind(
        "reset", "intent", "resets and GPU resets", ('{"action":"reset",', '{"action":"gpu-reset",')
    ),
    Kind(
        "drain",
        "intent",
        "drains and resumes of Slurm nodes",
        ('{"action":"drain",', '{"action":"resume",'),
    ),
    Kind("diag", "intent", "GPU diagnostics (dcgmi diag)", ('{"action":"diag",',)),
    Kind("review", audit.REVIEW, "reviews of interrupted actions"),
    Kind("claim", "claim", "claims, extensions, releases and the queue"),
    Kind("approval", "approval", "approval requests, decisions and their posts"),
    Kind("ladder", "ladder", "steps of the reclaim ladder"),
    Kind("maint", "maint", "maintenance windows opened, ended and refused"),
    Kind("digest", "alert", "the GPU-hours digest's posts", _DIGEST),
    Kind("alert", "alert", "alerts of findings", not_prefixes=_DIGEST),
    Kind("query", "query", "status and sweep queries"),
    Kind("lease", "lease", "lease takeovers"),
    Kind("seal", "seal", "seals of the chain"),
    Kind("chain", "chain", "the chain's key marker"),
)
BY_NAME = {k.name: k for k in KINDS}
# The default listing: what a person did or approved (gpubot's own records left out).
PEOPLE = ("action", "review", "claim", "approval", "ladder", "maint")

Listed = ActionSummary | AuditRecord  # an action (intent and outcome) or any other record


def parse_kinds(texts: Iterable[str]) -> tuple[str, ...]:
    """Return the kinds ``--kind`` values name, in ``KINDS`` order, or a ``ValueError``."""
    names = {w.strip().lower() for t in texts for w in t.split(",") if w.strip()}
    bad = sorted(names - set(BY_NAME))
    if bad or not names:
        raise ValueError(
            f"unknown kind {', '.join(map(repr, bad)) or repr('')}; "
            f"valid kinds: {', '.join(BY_NAME)}"
        )
    return tuple(k.name for k in KINDS if k.name in names)


def listing_kind(rec: AuditRecord) -> str:
    """Return the listing kind a stored record is shown as."""
    if rec.kind == "intent":
        return "action"
    if rec.kind == "alert" and rec.payload.startswith(_DIGEST):
        return "digest"
    return rec.kind


@dataclass(frozen=True)
class ListFilter:
    """What ``audit list`` asks for; ``kinds`` None: the people default (``PEOPLE``)."""

    kinds: tuple[str, ...] | None = None
    node: str | None = None
    actor: str | None = None
    since: datetime | None = None
    limit: int = 50


def listing(conn: Connection, f: ListFilter) -> list[Listed]:
    """Return the records ``f`` asks for, newest first, at most ``f.limit``."""
    people = f.kinds is None
    kinds = [BY_NAME[n] for n in (PEOPLE if f.kinds is None else f.kinds)]
    out: list[Listed] = []
    actions = [k for k in kinds if k.stored == "intent"]
    if actions:
        q = summaries_query(node=f.node, actor=f.actor, since=f.since, limit=f.limit)
        cond = _payload_condition(actions)
        q = q if cond is None else q.where(cond)
        out += audit.summaries(conn, q)
    for stored in dict.fromkeys(k.stored for k in kinds if k.stored != "intent"):
        q = records_query(stored, f, people)
        cond = _payload_condition([k for k in kinds if k.stored == stored])
        q = q if cond is None else q.where(cond)
        out += [audit.to_record(r) for r in conn.execute(q.limit(f.limit))]
    out.sort(key=_seq, reverse=True)
    return out[: f.limit]


def _seq(item: Listed) -> int:
    return item.id if isinstance(item, ActionSummary) else item.seq


def records_query(stored: str, f: ListFilter, people: bool) -> Select[Any]:
    """Return one stored kind's records, newest first; ``people``: not gpubot's own."""
    q = select(audit_log).where(audit_log.c.kind == stored).order_by(audit_log.c.seq.desc())
    q = narrow(q, f.node, f.actor, f.since)
    return q.where(audit_log.c.actor != GPUBOT) if people else q


def _payload_condition(kinds: Sequence[Kind]) -> ColumnElement[bool] | None:
    """Return the payload test of the listing kinds of one stored kind (None: all of it)."""
    if any(not k.prefixes and not k.not_prefixes for k in kinds):
        return None
    if {p for k in kinds for p in k.prefixes} & {p for k in kinds for p in k.not_prefixes}:
        return None  # a kind and its complement (alert and digest): all of it
    tests: list[ColumnElement[bool]] = []
    for k in kinds:
        if k.prefixes:
            tests.append(or_(*(_starts(p) for p in k.prefixes)))
        else:
            tests.append(and_(*(not_(_starts(p)) for p in k.not_prefixes)))
    return or_(*tests)


def _starts(prefix: str) -> ColumnElement[bool]:
    return audit_log.c.payload.startswith(prefix, autoescape=True)


class AuditListing(Part):
    """The reads of ``audit list --kind`` and ``audit show`` over a store's engine."""

    @reads("cannot read the audit log")
    def list(self, c: Connection, f: ListFilter) -> list[Listed]:
        return listing(c, f)

    @reads("cannot read the audit log")
    def record(self, c: Connection, seq: int) -> AuditRecord | None:
        """Return record ``seq`` as stored (None: no such record)."""
        row = c.execute(select(audit_log).where(audit_log.c.seq == seq)).one_or_none()
        return None if row is None else audit.to_record(row)
