"""``audit list --kind``'s store queries on memory, SQLite and PostgreSQL: each kind, the people
default, the ``--node/--actor/--since`` filters, newest first, and the index each query reads."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from gpubot.core.alerting import Delivery, Lookup, MessageRef, Posted
from gpubot.core.claims.rules import ClaimRequest, Granted
from gpubot.core.usage.report import Digest
from gpubot.services.digest import DigestService
from gpubot.services.outbox import Outbox
from gpubot.store import ActionSummary, AuditRecord, Store
from gpubot.store.audit import append
from gpubot.store.audit_kinds import (
    AuditListing,
    ListFilter,
    listing_kind,
    parse_kinds,
    records_query,
)
from gpubot.store.engine import write_tx
from gpubot.store.records import iso
from gpubot.store.tables import audit_log
from tests.fixtures.approvals import REQUEST
from tests.fixtures.clock import VirtualClock

T0 = time.time()  # claims are recorded at their start: now, for --since


def _append(store: Store, kind: str, actor: str, node: str | None, **payload: Any) -> int:
    with write_tx(store.engine) as conn:
        rec = append(conn, kind=kind, actor=actor, source="test", node=node, payload=payload)
        return rec.seq


def _claim(chat: str, node: str, gpu: int) -> ClaimRequest:
    return ClaimRequest(
        node=node,
        gpus=((gpu, f"GPU-{gpu:04d}"),),
        user=chat.lower(),
        chat_id=chat,
        start=T0,
        end=T0 + 4 * 3600,
        note="train",
        source="test",
    )


async def _fill(store: Store) -> dict[str, int]:
    """One record of each kind a person makes, and some of gpubot's own."""
    ids: dict[str, int] = {}
    ids["reset"] = await store.begin_action(
        kind="reset",
        actor="U1",
        source="slack",
        command="/gpu reset node1 gpu 2",
        node="node1",
        gpus=[2],
        plan=None,
    )
    await store.finish_action(ids["reset"], status="ok", result={})
    for verb in ("drain", "resume"):
        ids[verb] = await store.begin_action(
            kind=verb,
            actor="U6",
            source="slack",
            command=f"/gpu {verb} node4",
            node="node4",
            gpus=(),
            plan={"slurm_node": "node4", "approval": {"approver": "U6"}},
        )
        await store.finish_action(ids[verb], status="done", result={})
    ids["refused"] = await store.begin_action(
        kind="approve",
        actor="U3",
        source="slack",
        command="approve 9",
        node="node2",
        gpus=(),
        plan=None,
    )
    got = await store.claims.claim(_claim("U2", "node1", 2))
    assert isinstance(got, Granted)
    ids["claim"] = max(r.seq for r in await store.records() if r.kind == "claim")
    approval = await store.approvals.create("U1", "alice", "node3", REQUEST)
    await store.approvals.decide(approval.id, "U4", True, datetime.now(UTC))
    ids["approval"] = max(r.seq for r in await store.records() if r.kind == "approval")
    ids["ladder"] = _append(store, "ladder", "slack:U5", "node1", ladder="posted", gpu=2)
    ids["digest"], ids["digest_intent"] = await _digest_posted(store)
    ids["alert"] = _append(store, "alert", "gpubot", "node1", alert="alerted", key="k")
    ids["own"] = _append(store, "claim", "gpubot", "node1", change="offered")
    return ids


class _Weekly:
    """The digest's front end and its usage: every post lands."""

    async def post(self, report: object, *, token: str) -> Posted:
        return Posted(Delivery.POSTED, MessageRef("C2/3.5"))

    async def find(self, token: str, since: datetime) -> Lookup:
        return Lookup(True)

    async def report_of(self, window: object, by: str, now: float) -> str:
        return "report"


async def _digest_posted(store: Store) -> tuple[int, int]:
    """Post a weekly digest through the outbox; return its records' seqs (outcome, intent)."""
    digest, weekly = Digest.parse("mon 09:00"), _Weekly()
    clock = VirtualClock(digest.last_due(T0) + 60)
    usage: Any = weekly
    svc = DigestService(digest, "user", usage, Outbox(store.outbox), weekly, clock=clock)
    assert await svc.run_due() is not None
    intent, outcome = [r for r in await store.records() if r.kind == "alert"][-2:]
    assert outcome.data["outcome"] == "posted" and outcome.data["ref"] == "C2/3.5"
    return outcome.seq, intent.seq


def _ids(items: list[ActionSummary | AuditRecord]) -> list[int]:
    return [i.id if isinstance(i, ActionSummary) else i.seq for i in items]


async def test_each_kind_and_the_people_default(store: Store) -> None:
    ids = await _fill(store)
    listing = AuditListing(store.engine)

    async def kinds(*names: str) -> list[int]:
        return _ids(await listing.list(ListFilter(parse_kinds(names) if names else None)))

    people = await kinds()
    assert people == sorted(people, reverse=True)  # newest first
    for kind in ("reset", "drain", "resume", "refused", "claim", "approval", "ladder"):
        assert ids[kind] in people, kind
    assert not {ids["digest"], ids["alert"], ids["own"]} & set(people)  # gpubot's own
    assert ids["claim"] in await kinds("claim") and ids["own"] in await kinds("claim")
    assert ids["reset"] not in await kinds("claim")
    assert await kinds("reset") == [ids["reset"]]  # a refused approval is no reset
    assert await kinds("drain") == [ids["resume"], ids["drain"]]  # and a drain no reset
    assert await kinds("action") == [ids["refused"], ids["resume"], ids["drain"], ids["reset"]]
    assert await kinds("digest") == [ids["digest"], ids["digest_intent"]]
    assert ids["digest"] not in await kinds("alert") and ids["alert"] in await kinds("alert")
    assert set(await kinds("alert,digest")) == {ids["alert"], ids["digest"], ids["digest_intent"]}
    assert await kinds("ladder") == [ids["ladder"]]
    approvals = await listing.list(ListFilter(("approval",)))
    assert {r.actor for r in approvals if isinstance(r, AuditRecord)} >= {"U1", "U4"}
    assert all(listing_kind(r) == "approval" for r in approvals if isinstance(r, AuditRecord))


async def test_node_actor_since_and_limit_filter(store: Store) -> None:
    ids = await _fill(store)
    listing = AuditListing(store.engine)
    on_node1 = _ids(await listing.list(ListFilter(node="node1")))
    assert on_node1 == [ids["ladder"], ids["claim"], ids["reset"]]
    by_u2 = _ids(await listing.list(ListFilter(actor="U2")))
    assert by_u2 == [ids["claim"]]
    now = datetime.now(UTC)
    assert await listing.list(ListFilter(since=now + timedelta(hours=1))) == []
    recent = _ids(await listing.list(ListFilter(since=now - timedelta(minutes=90))))
    assert ids["claim"] in recent
    assert len(await listing.list(ListFilter(limit=2))) == 2
    assert (await listing.record(ids["claim"])) is not None
    assert await listing.record(10_000) is None


def test_an_unknown_kind_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown kind 'claims'; valid kinds: action, reset,"):
        parse_kinds(["claim", "claims"])
    assert parse_kinds(["ladder,claim", "claim"]) == ("claim", "ladder")


def test_a_kind_on_a_node_reads_through_the_node_index(store: Store) -> None:
    now = datetime(2027, 6, 1, tzinfo=UTC)
    rows = [
        {
            "seq": i,
            "action_id": None,
            "kind": "claim" if i % 50 == 0 else ("query", "alert")[i % 2],  # claims are few
            "created_at": iso(now - timedelta(minutes=6000 - i)),
            "actor": "U1",
            "source": "slack",
            "node": f"node{i % 1000}",
            "payload": "{}",
            "prev_hash": f"{i:064x}",
            "hash": f"{i + 1:064x}",
        }
        for i in range(1, 6001)
    ]
    with store.engine.begin() as conn:
        conn.execute(audit_log.insert(), rows)
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql("ANALYZE audit_log")
    for f, index in (
        (ListFilter(("claim",), node="node7", since=now - timedelta(hours=1)), "node_kind_seq"),
        (ListFilter(("claim",)), "ix_audit_log_kind_seq"),
    ):
        plan = _plan(store, records_query("claim", f, people=True).limit(50))
        assert index in plan, plan
        assert "SCAN audit_log" not in plan and "Seq Scan" not in plan, plan


def _plan(store: Store, query: sa.Select[Any]) -> str:
    with store.engine.connect() as conn:
        sql = str(query.compile(conn, compile_kwargs={"literal_binds": True}))
        if conn.dialect.name == "sqlite":
            rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}").all()
            return "\n".join(str(r[-1]) for r in rows)
        return "\n".join(str(r[0]) for r in conn.exec_driver_sql(f"EXPLAIN {sql}").all())
