"""Appending to the audit chain and reading it back (synchronous; ``Store`` runs it in threads).

``append`` must run inside ``engine.write_tx`` so that the head it reads cannot move under it. A
log once keyed takes records only from writers holding the same key.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import Connection, Row, Select, and_, exists, select

from gpubot.core.models import ActionStatus
from gpubot.errors import StoreError, UsageError
from gpubot.store.audit_list import narrow
from gpubot.store.chain import (
    GENESIS,
    MARKER,
    Chained,
    canonical_json,
    check_published,
    key_id,
    marker_key_id,
    marker_payload,
    record_hash,
    walk,
)
from gpubot.store.engine import NEW_HEAD, audit_key_of
from gpubot.store.headfile import FileHead, HeadFileError, HeadFileMissing, compare
from gpubot.store.records import (
    ActionDetail,
    ActionSummary,
    AuditRecord,
    VerifyResult,
    iso,
    parse_opt,
)
from gpubot.store.seals import SEAL, SealRule, age_problem, seal_payload
from gpubot.store.tables import audit_head, audit_log

PAGE = 2000  # records read per query while walking the chain
REVIEW = "review"  # a person's note that an interrupted action was looked at (``review``)
RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(AuditRecord))


def append(
    conn: Connection,
    *,
    kind: str,
    actor: str,
    source: str,
    node: str | None,
    payload: Mapping[str, Any],
    action_id: int | Literal["own"] | None = None,
    now: datetime | None = None,
) -> AuditRecord:
    """Append one record after the chain head; ``action_id="own"``: an intent, its own seq."""
    top = head(conn)
    if top is None:
        raise StoreError("the audit chain head is missing: was `gpubot db upgrade` run?")
    at = iso(now or datetime.now(UTC))
    key = audit_key_of(conn)
    seq, prev = top
    if _keyed_from(conn, key) is None and key is not None:  # the first keyed record: say so
        marker = canonical_json(marker_payload(key))
        chained = Chained(seq + 1, None, MARKER, at, "gpubot", "gpubot", None, marker)
        seq, prev = seq + 1, _insert(conn, prev, key, chained).hash
    own = seq + 1 if action_id == "own" else action_id
    chained = Chained(seq + 1, own, kind, at, actor, source, node, canonical_json(payload))
    return _insert(conn, prev, key, chained)


def head(conn: Connection) -> tuple[int, str] | None:
    """Return the chain head (seq, hash); None: the schema has none."""
    q = select(audit_head.c.seq, audit_head.c.hash).where(audit_head.c.id == 1)
    row = conn.execute(q).one_or_none()
    return None if row is None else (int(row.seq), str(row.hash))


def _keyed_from(conn: Connection, key: bytes | None) -> int | None:
    """Return the seq of the log's chain marker (None: plain); refuse a writer without its key."""
    marker = conn.execute(
        select(audit_log.c.seq, audit_log.c.payload)
        .where(audit_log.c.kind == MARKER)
        .order_by(audit_log.c.seq)
        .limit(1)
    ).one_or_none()
    if marker is None:
        return None
    kid = marker_key_id(marker.payload)
    if key is None:
        raise StoreError(
            f"the audit log is keyed (HMAC-SHA256, key id {kid}) from record {marker.seq}: "
            "set GPUBOT_AUDIT_KEY to write to it"
        )
    if kid != key_id(key):
        raise StoreError(
            f"GPUBOT_AUDIT_KEY (key id {key_id(key)}) is not the key the audit log is keyed "
            f"with (key id {kid}, from record {marker.seq})"
        )
    return int(marker.seq)


def _insert(conn: Connection, head_hash: str, key: bytes | None, fields: Chained) -> AuditRecord:
    """Write the record after the head (its seq - 1, ``head_hash``) and move the head to it."""
    digest = record_hash(head_hash, fields, key)
    values = dataclasses.asdict(fields)
    conn.execute(audit_log.insert().values(**values, prev_hash=head_hash, hash=digest))
    updated = conn.execute(
        audit_head.update()
        .where(and_(audit_head.c.id == 1, audit_head.c.seq == fields.seq - 1))
        .values(seq=fields.seq, hash=digest)
    )
    if updated.rowcount != 1:  # only possible if the write lock was not held
        raise StoreError("the audit chain head moved during an append")
    conn.info[NEW_HEAD] = (fields.seq, digest, fields.created_at)  # for ``engine.write_tx``'s hook
    return AuditRecord(**values, prev_hash=head_hash, hash=digest)


def to_record(row: Row[Any]) -> AuditRecord:
    return AuditRecord(**{f: row._mapping[f] for f in RECORD_FIELDS})


def intent_of(conn: Connection, action_id: int) -> tuple[AuditRecord, AuditRecord | None]:
    """Return an action's intent and outcome (None while incomplete); StoreError if unknown."""
    rows = conn.execute(
        select(audit_log).where(
            audit_log.c.action_id == action_id, audit_log.c.kind.in_(("intent", "outcome"))
        )
    ).all()
    recs = {r.kind: to_record(r) for r in rows}
    if "intent" not in recs:
        raise StoreError(f"no action {action_id} in the audit log")
    return recs["intent"], recs.get("outcome")


def summaries(conn: Connection, q: Select[Any]) -> list[ActionSummary]:
    """Return the actions ``q`` (an ``audit_list.summaries_query``) finds, with their status."""
    return [summary(to_record(r), r.o_payload, r.o_at) for r in conn.execute(q).all()]


def interrupted(conn: Connection, nodes: Sequence[str] | None = None) -> list[ActionSummary]:
    """Return the actions with an intent but neither an outcome nor a review, newest first, in
    one query through the ``(kind, seq)`` and ``action_id`` indexes."""
    rows = conn.execute(interrupted_query(nodes)).all()
    return [summary(to_record(r), None, None) for r in rows]


def interrupted_query(nodes: Sequence[str] | None) -> Select[Any]:
    """Return ``interrupted``'s query (a test reads its plan on both databases)."""
    later = audit_log.alias("later")
    ended = exists().where(
        later.c.action_id == audit_log.c.action_id, later.c.kind.in_(("outcome", REVIEW))
    )
    q = select(audit_log).where(audit_log.c.kind == "intent", ~ended)
    if nodes is not None:
        q = q.where(audit_log.c.node.in_(list(nodes)))
    return q.order_by(audit_log.c.seq.desc())


def review(
    conn: Connection, action_id: int, *, actor: str, source: str, note: str, now: datetime
) -> AuditRecord:
    """Append a review of an interrupted action (inside ``write_tx``); refuse any other."""
    intent, outcome = intent_of(conn, action_id)
    if outcome is not None:
        status = outcome.data.get("status", "?")
        raise UsageError(f"action {action_id} finished ({status}): there is nothing to review")
    done = conn.execute(
        select(audit_log.c.actor, audit_log.c.created_at).where(
            audit_log.c.action_id == action_id, audit_log.c.kind == REVIEW
        )
    ).first()
    if done is not None:
        raise UsageError(
            f"action {action_id} was marked reviewed already, by {done.actor} at {done.created_at}"
        )
    payload = {"reviewed": action_id, "action": intent.data.get("action", ""), "note": note}
    return append(
        conn,
        kind=REVIEW,
        actor=actor,
        source=source,
        node=intent.node,
        payload=payload,
        action_id=action_id,
        now=now,
    )


def summary(
    intent: AuditRecord, outcome_payload: str | None, outcome_at: str | None
) -> ActionSummary:
    data = intent.data
    status: str = ActionStatus.INCOMPLETE
    if outcome_payload is not None:
        status = str(json.loads(outcome_payload).get("status", ActionStatus.UNKNOWN))
    return ActionSummary(
        id=intent.seq,
        kind=str(data.get("action", "")),
        actor=intent.actor,
        source=intent.source,
        command=str(data.get("command", "")),
        node=intent.node,
        gpus=tuple(int(g) for g in data.get("gpus", ())),
        started_at=intent.time,
        status=status,
        finished_at=parse_opt(outcome_at),
    )


def detail(conn: Connection, action_id: int) -> ActionDetail | None:
    """Return an action's intent, events and outcome, or None if there is no such action."""
    rows = conn.execute(
        select(audit_log).where(audit_log.c.action_id == action_id).order_by(audit_log.c.seq)
    ).all()
    recs = tuple(to_record(r) for r in rows)
    intent = next((r for r in recs if r.kind == "intent"), None)
    if intent is None:
        return None
    out = next((r for r in recs if r.kind == "outcome"), None)
    o_payload, o_at = (None, None) if out is None else (out.payload, out.created_at)
    return ActionDetail(
        summary=summary(intent, o_payload, o_at),
        plan=intent.data.get("plan"),
        events=tuple(r for r in recs if r.kind == "event"),
        result=None if out is None else out.data.get("result"),
        records=recs,
    )


def page(
    conn: Connection,
    *,
    after: int = 0,
    limit: int = PAGE,
    kind: str | None = None,
    actor: str | None = None,
    since: datetime | None = None,
    newest_first: bool = False,
) -> list[AuditRecord]:
    """Return up to ``limit`` records after seq ``after`` (or newest first), optionally filtered."""
    q = select(audit_log)
    if newest_first:
        q = q.order_by(audit_log.c.seq.desc())
    else:
        q = q.where(audit_log.c.seq > after).order_by(audit_log.c.seq)
    if kind is not None:
        q = q.where(audit_log.c.kind == kind)
    q = narrow(q, None, actor, since)
    return [to_record(r) for r in conn.execute(q.limit(limit)).all()]


def _all(conn: Connection) -> Iterator[AuditRecord]:
    after = 0
    while True:
        batch = page(conn, after=after)
        yield from batch
        if len(batch) < PAGE:
            return
        after = batch[-1].seq


def hash_at(conn: Connection, seq: int) -> str | None:
    found = conn.execute(select(audit_log.c.hash).where(audit_log.c.seq == seq)).scalar()
    return None if found is None else str(found)


def seal(
    conn: Connection,
    *,
    reason: str,
    every_s: float,
    prev: tuple[int, str] | None,
    after: int | None = None,
    now: datetime | None = None,
) -> tuple[AuditRecord, bool]:
    """Append a seal; return it and whether the log still holds ``prev``. The seal names
    ``prev`` even when the log no longer holds it: that is the evidence."""
    if audit_key_of(conn) is None:
        raise StoreError("a seal needs GPUBOT_AUDIT_KEY: without the key anyone could forge one")
    held = prev is None or hash_at(conn, prev[0]) == prev[1]
    payload = seal_payload(reason, every_s, prev, after)
    rec = append(
        conn, kind=SEAL, actor="gpubot", source="gpubot", node=None, payload=payload, now=now
    )
    return rec, held


def verify(
    conn: Connection,
    published: tuple[int, str] | None = None,
    *,
    seals: SealRule | None = None,
    now: datetime | None = None,
    file_head: FileHead | HeadFileError | None = None,
    head_file: str = "",
) -> VerifyResult:
    """Walk the whole chain inside one snapshot and report the first record that is not intact;
    ``file_head`` was read before this snapshot."""
    top = head(conn)
    if top is None:
        return VerifyResult(False, 0, 0, "the chain head is missing", GENESIS)

    def seq_of_hash(h: str) -> int | None:
        found = conn.execute(select(audit_log.c.seq).where(audit_log.c.hash == h)).scalar()
        return None if found is None else int(found)

    key = audit_key_of(conn)
    result = walk(_all(conn), top, seq_of_hash, key)
    if published is not None:
        found = hash_at(conn, published[0])
        result = check_published(result, published, found, top[0])
    walked = result.first_bad_seq is None and not result.unverified  # to the end: its seals
    if seals is not None and result.mode == "keyed" and walked:
        result = _check_seal_age(result, seals, now or datetime.now(UTC))
    if file_head is not None:
        result = _check_file(conn, result, file_head, head_file, top[0], key)
    return result


def _check_seal_age(result: VerifyResult, rule: SealRule, now: datetime) -> VerifyResult:
    age = None if result.seal is None else (now - result.seal.time).total_seconds()
    why = age_problem(result.seal, now, rule)
    if why is None:
        return dataclasses.replace(result, seal_age_s=age)
    return dataclasses.replace(result, ok=False, seal_age_s=age, end=(*result.end, why))


def _check_file(
    conn: Connection,
    result: VerifyResult,
    file_head: FileHead | HeadFileError,
    path: str,
    db_seq: int,
    key: bytes | None,
) -> VerifyResult:
    """Add what the head file says about the log's end to ``result``."""
    if isinstance(file_head, HeadFileMissing) and db_seq == 0:
        return result  # nothing written yet, so no head to record
    if isinstance(file_head, HeadFileError):
        why = str(file_head)
        if isinstance(file_head, HeadFileMissing):
            why += ": gpubot has written nothing since [audit] head_file was set, or it was removed"
        return dataclasses.replace(result, ok=False, end=(*result.end, why))
    found = compare(file_head, path, hash_at(conn, file_head.seq), db_seq, key)
    if found is None:
        return dataclasses.replace(result, file_head=(file_head.seq, file_head.hash, file_head.at))
    why, tampered = found
    return dataclasses.replace(
        result, ok=False, end=(*result.end, why), end_tampered=result.end_tampered or tampered
    )
