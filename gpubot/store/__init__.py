"""The audit store: an append-only, hash-chained log of every action, plus approvals, alerts
and the GPU samples of sweeps.

SQLAlchemy Core over SQLite or PostgreSQL; the async methods run the synchronous engine in a
worker thread. ``memory://`` is the same store over SQLite in memory. Every failure is a
``StoreError``: callers fail closed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import Connection

from gpubot.core.lease import Fence
from gpubot.core.models import ActionStatus
from gpubot.errors import StoreError
from gpubot.store import audit, version
from gpubot.store.alerts import DbAlerts
from gpubot.store.approvals import DbApprovals
from gpubot.store.audit_list import summaries_query
from gpubot.store.claims import DbClaims
from gpubot.store.dm_due import DbDmDue
from gpubot.store.engine import (
    MEMORY,
    Part,
    guard,
    is_empty,
    is_memory,
    make_engine,
    memory_url,
    parse_url,
    reads,
    run_tx,
    set_up_memory,
    write_tx,
    writes,
)
from gpubot.store.headfile import FileHead, HeadFile, HeadFileError
from gpubot.store.health import DbEcc
from gpubot.store.ladder import DbLadder
from gpubot.store.leases import check_fence
from gpubot.store.maint import DbMaint
from gpubot.store.outbox import DbOutbox
from gpubot.store.query_records import query_payload
from gpubot.store.records import ActionDetail, ActionSummary, Approval, AuditRecord, VerifyResult
from gpubot.store.samples import DbSamples
from gpubot.store.seals import SealRule
from gpubot.store.usage import DbUsage
from gpubot.store.waits import in_thread

READ = "cannot read the audit log"
Who = tuple[str, str, str | None]  # actor, source, node of a record

__all__ = [
    "ActionDetail",
    "ActionSummary",
    "Approval",
    "AuditRecord",
    "SealRule",
    "Store",
    "VerifyResult",
    "open_store",
]


def open_store(
    url: str,
    *,
    password: str | None = None,
    audit_key: bytes | None = None,
    check_schema: bool = True,
    head_file: str | None = None,
) -> Store:
    """Open the store at ``url``; with ``check_schema``, refuse a database that is behind. A new
    SQLite database sets itself up; PostgreSQL is migrated only by ``gpubot db upgrade``."""
    store = Store(url, password=password, audit_key=audit_key, head_file=head_file)
    if check_schema:
        try:
            if not version.at_head(store.engine) and is_empty(store.engine):
                if is_memory(store.url):
                    set_up_memory(store.engine, store.upgrade)
                else:
                    store.upgrade()
            version.check(store.engine)
        except BaseException:
            store.close()
            raise
    return store


@dataclass(frozen=True)
class SealWritten:
    """A seal appended: the record, the record it names, whether the log still held that."""

    record: AuditRecord
    prev: tuple[int, str] | None
    held: bool


class Store(Part):
    """The audit log (implements ``gpubot.core.ports.AuditStore``), approvals, alerts, samples."""

    def __init__(
        self,
        url: str,
        *,
        password: str | None = None,
        audit_key: bytes | None = None,
        head_file: str | None = None,
    ) -> None:
        """``audit_key`` makes the audit chain an HMAC chain (see ``store.chain``);
        ``head_file``: write the chain head there after every write (``store.headfile``)."""
        self.audit_key = audit_key
        self.head_file = None if head_file is None else HeadFile(head_file, audit_key)
        if url == MEMORY:
            url = memory_url()  # one name, so that ``self.url`` names this store's database
        self.engine = make_engine(url, password, audit_key=audit_key, on_append=self._appended)
        super().__init__(self.engine)
        self.url = url if is_memory(url) else parse_url(url).render_as_string(hide_password=True)
        self.clock: Callable[[], datetime] = lambda: datetime.now(UTC)  # record times
        self.last_written: tuple[int, str] | None = None  # (seq, hash): the last record it wrote
        self._last_lock = threading.Lock()
        self._running: set[int] = set()  # actions begun here whose outcome is not yet written
        self.approvals = DbApprovals(self.engine)
        self.outbox = DbOutbox(self.engine)  # every post that must appear once
        self.alerts = DbAlerts(self.engine)
        self.samples = DbSamples(self.engine)
        self.ecc = DbEcc(self.engine)  # the sweep's ECC counts
        self.usage = DbUsage(self.engine)  # GPU-hours
        self.ladder = DbLadder(self.engine)  # the reclaim ladder
        self.claims = DbClaims(self.engine)  # GPU claims and the queue
        self.maint = DbMaint(self.engine)  # maintenance windows
        self.dm_due = DbDmDue(self.engine)  # DMs for another front end's process

    # -- actions ---------------------------------------------------------------------------

    async def begin_action(
        self,
        *,
        kind: str,
        actor: str,
        source: str,
        command: str,
        node: str | None,
        gpus: Sequence[int],
        plan: Mapping[str, Any] | None,
        fence: Fence | None = None,
    ) -> int:
        """Write the intent of an action BEFORE anything happens; return the action id."""
        payload = {"action": kind, "command": command, "gpus": list(gpus), "plan": plan}
        action_id = await self._begin((actor, source, node), payload, fence)
        self._running.add(action_id)  # not interrupted while this process runs it
        return action_id

    @writes("cannot record the intent, so nothing was done")
    def _begin(self, c: Connection, who: Who, payload: dict[str, Any], fence: Fence | None) -> int:
        if fence is not None:
            check_fence(c, fence, self.clock())
        return self._append(c, "intent", who, payload, "own").seq

    async def record_event(
        self, action_id: int, event: Mapping[str, Any], *, fence: Fence | None = None
    ) -> None:
        await in_thread(self._follow, action_id, "event", dict(event), fence)

    async def finish_action(
        self,
        action_id: int,
        *,
        status: str,
        result: Mapping[str, Any],
        fence: Fence | None = None,
    ) -> None:
        """Append the outcome of an action once; never ``incomplete``: that is no outcome."""
        if not status or status == ActionStatus.INCOMPLETE:
            raise StoreError(f"an outcome needs a status other than {status!r}")
        try:
            await in_thread(
                self._follow, action_id, "outcome", {"status": status, "result": result}, fence
            )
        finally:  # written or not, this process is done with it: unwritten, it is interrupted
            self._running.discard(action_id)

    def _follow(
        self, action_id: int, kind: str, payload: dict[str, Any], fence: Fence | None = None
    ) -> None:
        with guard(f"cannot record the {kind} of action {action_id}"), write_tx(self.engine) as c:
            if fence is not None:  # the lease first: a lost one writes nothing
                check_fence(c, fence, self.clock())
            intent, outcome = audit.intent_of(c, action_id)
            if outcome is not None:
                raise StoreError(f"action {action_id} is finished already")
            self._append(c, kind, (intent.actor, intent.source, intent.node), payload, action_id)

    async def record_query(
        self,
        *,
        kind: str,
        actor: str,
        source: str,
        nodes: Sequence[str],
        failed: Mapping[str, str],
        seconds: float,
        changed: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        payload = query_payload(kind, nodes, failed, seconds, changed)
        node = nodes[0] if len(nodes) == 1 else None
        await self._query((actor, source, node), payload)

    @writes("cannot record the query")
    def _query(self, c: Connection, who: Who, payload: dict[str, Any]) -> None:
        self._append(c, "query", who, payload)

    def _append(
        self,
        c: Connection,
        kind: str,
        who: Who,
        payload: dict[str, Any],
        action_id: int | Literal["own"] | None = None,
    ) -> AuditRecord:
        actor, source, node = who
        return audit.append(
            c,
            kind=kind,
            actor=actor,
            source=source,
            node=node,
            payload=payload,
            action_id=action_id,
            now=self.clock(),
        )

    # -- seals and the head outside the database ---------------------------------------------

    def _appended(self, seq: int, digest: str, at: str) -> None:
        """After each committed append: remember it, and write it to the head file."""
        with self._last_lock:
            if self.last_written is None or seq > self.last_written[0]:
                self.last_written = (seq, digest)
        if self.head_file is not None:
            self.head_file.record(seq, digest, at, self._holds)

    def _holds(self, seq: int, digest: str) -> bool:
        return run_tx(self.engine, READ, lambda c: audit.hash_at(c, seq) == digest)

    async def seal(self, reason: str, every_s: float, *, after: int | None = None) -> SealWritten:
        """Append a keyed seal naming the last record this store wrote (``StoreError`` without
        the key); ``held`` False: the log no longer holds that record, and the seal says so."""
        return await in_thread(self._seal, reason, every_s, after)

    def _seal(self, reason: str, every_s: float, after: int | None) -> SealWritten:
        prev = self.last_written
        with guard("cannot write the audit seal"), write_tx(self.engine) as c:
            now = self.clock()
            rec, held = audit.seal(
                c, reason=reason, every_s=every_s, prev=prev, after=after, now=now
            )
        return SealWritten(rec, prev, held)

    # -- reading ---------------------------------------------------------------------------

    @reads(READ)
    def incomplete_actions(
        self, c: Connection, nodes: Sequence[str] | None = None
    ) -> list[ActionSummary]:
        """Return unreviewed actions with an intent but no outcome, newest first."""
        return audit.interrupted(c, nodes)

    async def interrupted(self, nodes: Sequence[str] | None = None) -> list[ActionSummary]:
        """``incomplete_actions`` but this process's running ones; another process's running
        action is listed (nothing tells it from a dead one)."""
        found = await self.incomplete_actions(nodes)
        return [a for a in found if a.id not in self._running]

    async def review_action(
        self, action_id: int, *, actor: str, source: str, note: str = ""
    ) -> AuditRecord:
        """Record that ``actor`` looked at an interrupted action, so it is no longer listed."""
        return await in_thread(self._review, action_id, actor, source, note)

    def _review(self, action_id: int, actor: str, source: str, note: str) -> AuditRecord:
        with guard(f"cannot record the review of action {action_id}"), write_tx(self.engine) as c:
            now = self.clock()
            return audit.review(c, action_id, actor=actor, source=source, note=note, now=now)

    @reads(READ)
    def actions(
        self,
        c: Connection,
        *,
        node: str | None = None,
        actor: str | None = None,
        since: datetime | None = None,
        limit: int = 50,
    ) -> list[ActionSummary]:
        """Return actions newest first; ``actor`` matches any part of the recorded actor."""
        return audit.summaries(c, summaries_query(node=node, actor=actor, since=since, limit=limit))

    @reads(READ)
    def queries(
        self,
        c: Connection,
        *,
        actor: str | None = None,
        since: datetime | None = None,
        limit: int = 50,
    ) -> list[AuditRecord]:
        """Return status and sweep records, newest first."""
        return audit.page(c, kind="query", actor=actor, since=since, limit=limit, newest_first=True)

    @reads(READ)
    def action(self, c: Connection, action_id: int) -> ActionDetail | None:
        return audit.detail(c, action_id)

    @reads(READ)
    def records(
        self, c: Connection, *, after: int = 0, limit: int = audit.PAGE
    ) -> list[AuditRecord]:
        """Return up to ``limit`` raw records after seq ``after``, in chain order (for export)."""
        return audit.page(c, after=after, limit=limit)

    async def verify(
        self,
        *,
        published: tuple[int, str] | None = None,
        seals: SealRule | None = None,
        now: datetime | None = None,
    ) -> VerifyResult:
        """Walk the chain and report the first record edited, removed or reordered. The head
        file is read before the walk's snapshot, so a write meanwhile cannot look like a cut."""
        file_head: FileHead | HeadFileError | None = None
        if self.head_file is not None:
            try:
                file_head = await in_thread(self.head_file.read)
            except HeadFileError as exc:
                file_head = exc
        return await self._verify(published, seals, now or self.clock(), file_head)

    @reads(READ)
    def _verify(
        self,
        c: Connection,
        published: tuple[int, str] | None,
        seals: SealRule | None,
        now: datetime,
        file_head: FileHead | HeadFileError | None,
    ) -> VerifyResult:
        path = "" if self.head_file is None else self.head_file.path
        return audit.verify(c, published, seals=seals, now=now, file_head=file_head, head_file=path)

    # -- schema ----------------------------------------------------------------------------

    def upgrade(self, revision: str = "head") -> None:
        from gpubot.store import migrate  # Alembic, only when migrating

        migrate.upgrade(self.engine, revision)

    def downgrade(self, revision: str, check: Callable[[Connection], None] | None = None) -> None:
        """Undo migrations down to ``revision``; ``check`` runs first under the write lock."""
        from gpubot.store import migrate  # Alembic, only when migrating

        migrate.downgrade(self.engine, revision, check)

    def revision(self) -> tuple[str | None, str]:
        """Return the database's revision (None when empty) and the one this gpubot needs."""
        from gpubot.store import migrate  # Alembic, only when migrating

        return migrate.current(self.engine), migrate.head()

    def close(self) -> None:
        self.engine.dispose()
