"""The reclaim ladder's state (``usage.ladder``): one row per idle holder, every change audited.

A step is recorded and audited in one transaction before its message is sent (at most once), and
taken only from the step before by a conditional update, so two replicas never both send it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from sqlalchemy import Connection, Row, delete, select

from gpubot.core.usage.ladder import Rung, Step
from gpubot.errors import StoreError, UsageError
from gpubot.store.audit import append
from gpubot.store.engine import Part, reads, writes
from gpubot.store.records import parse_iso, text_of, unix_of
from gpubot.store.tables import idle_ladder as t


class DbLadder(Part):
    """The ladder's rows; every method is async and raises ``StoreError``."""

    @reads("cannot read the reclaim ladder")
    def rungs(self, conn: Connection) -> dict[str, Rung]:
        return {r.finding: _rung(r) for r in conn.execute(select(t))}

    @writes("cannot record the Keep")
    def keep(self, conn: Connection, finding: str, by: str, reason: str, now: float) -> Rung:
        """Stop a ladder: the owner keeps the GPU, for ``reason`` (audited)."""
        row = _row(conn, finding)
        if row is None:
            raise UsageError("this GPU is no longer on the reclaim ladder: nothing to keep")
        conn.execute(
            t.update()
            .where(t.c.finding == finding)
            .values(kept_by=by, kept_reason=reason, kept_at=text_of(now))
        )
        rung = _rung(row)
        _audit(conn, rung, "kept", by, now, {"reason": reason})
        return replace(rung, kept_by=by, kept_reason=reason, kept_at=now)

    @writes("cannot record the reclaim ladder's step")
    def climb(
        self, conn: Connection, rung: Rung, step: Step, now: float, detail: Mapping[str, Any]
    ) -> Rung | None:
        """Record and audit ``rung`` reaching ``step``; None when another replica took it first."""
        at = text_of(now)
        if step is Step.DM:
            if _row(conn, rung.finding) is not None:
                return None
            conn.execute(
                t.insert().values(
                    finding=rung.finding,
                    node=rung.node,
                    gpu_index=rung.gpu,
                    owner=rung.owner,
                    step=int(step),
                    started_at=at,
                    step_at=at,
                )
            )
        else:
            done = conn.execute(
                t.update()
                .where(
                    t.c.finding == rung.finding, t.c.step == int(step) - 1, t.c.kept_at.is_(None)
                )
                .values(step=int(step), step_at=at)
            ).rowcount
            if done != 1:
                return None
        _audit(conn, rung, step.label, "gpubot", now, detail)
        return replace(rung, step=step, step_at=now, started_at=_started(conn, rung.finding))

    @writes("cannot audit the reclaim ladder")
    def note(
        self, conn: Connection, finding: str, what: str, by: str, detail: Mapping[str, Any]
    ) -> None:
        """Audit something done on a ladder (on-call's *Free it* asked), its row unchanged."""
        row = _row(conn, finding)
        if row is None:
            raise StoreError("no reclaim ladder for this finding")
        _audit(conn, _rung(row), what, by, None, detail)

    @writes("cannot end the reclaim ladder")
    def leave(self, conn: Connection, findings: Iterable[str], now: float, why: str) -> list[Rung]:
        """End the ladders of holders no longer idle (audited); return them."""
        out: list[Rung] = []
        for finding in dict.fromkeys(findings):
            row = _row(conn, finding)
            if row is None:
                continue
            conn.execute(delete(t).where(t.c.finding == finding))
            rung = _rung(row)
            _audit(conn, rung, "ended", "gpubot", now, {"why": why})
            out.append(rung)
        return out


def _row(conn: Connection, finding: str) -> Row[Any] | None:
    return conn.execute(select(t).where(t.c.finding == finding)).one_or_none()


def _started(conn: Connection, finding: str) -> float:
    row = _row(conn, finding)
    assert row is not None
    return unix_of(row.started_at)


def _rung(r: Row[Any]) -> Rung:
    return Rung(
        r.finding,
        r.node,
        int(r.gpu_index),
        r.owner,
        Step(int(r.step)),
        unix_of(r.started_at),
        unix_of(r.step_at),
        r.kept_by,
        r.kept_reason,
        None if r.kept_at is None else unix_of(r.kept_at),
    )


def _audit(
    conn: Connection,
    rung: Rung,
    what: str,
    by: str,
    now: float | None,
    detail: Mapping[str, Any],
) -> None:
    payload = {"ladder": what, "key": rung.finding, "gpu": rung.gpu, "owner": rung.owner}
    append(
        conn,
        kind="ladder",
        actor=by,
        source=by.partition(":")[0] if ":" in by else "gpubot",  # "slack:U…", "console:…"
        node=rung.node,
        now=None if now is None else parse_iso(text_of(now)),
        payload={**payload, **detail},
    )
