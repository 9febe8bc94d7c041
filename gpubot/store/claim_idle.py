"""Idle claims on the database: each claim keeps its GPU's idle run, never a history; asking
Keep / Release once, and a Keep, are conditional writes, audited."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, Engine, func, or_, select

from gpubot.core.claims.rules import Claim, ClaimState
from gpubot.store.claim_rows import at, record, unix
from gpubot.store.engine import guard, write_tx
from gpubot.store.tables import claims
from gpubot.store.waits import in_thread

IdleUpdate = tuple[int, float | None, float, float | None]  # id, idle since, last look, read


class IdleMixin:
    """The idle-claim methods of ``DbClaims``."""

    _engine: Engine

    def _get_in(self, c: Connection, claim_id: int) -> Claim:
        raise NotImplementedError

    async def advance_idle(self, updates: Sequence[IdleUpdate]) -> None:
        """Store each claim's idle run, only over the one it was folded from: a Keep in between
        started the run anew, and stands. A GPU no longer idle forgets the question asked."""
        if updates:
            await in_thread(self._advance_idle, list(updates))

    async def mark_idle_dm(self, claim_id: int, now: float) -> bool:
        """Record that the holder is asked Keep / Release; False when it was (one DM in all)."""
        return await in_thread(self._mark_idle_dm, claim_id, now)

    async def tell_intruder(self, claim_id: int, key: str, now: float) -> bool:
        """Record that the holder is told of intruder ``key``; False when they were already."""
        return await in_thread(self._tell_intruder, claim_id, key, now)

    def _tell_intruder(self, claim_id: int, key: str, now: float) -> bool:
        with guard("cannot record the intruder"), write_tx(self._engine) as c:
            done = c.execute(
                claims.update()
                .where(
                    claims.c.id == claim_id,
                    claims.c.state == ClaimState.ACTIVE.value,
                    or_(
                        claims.c.intruder_told.is_(None),
                        ~claims.c.intruder_told.contains(f"\n{key}\n", autoescape=True),
                    ),
                )
                # Every intruder told of, one a line ("\nk1\nk2\n"): not only the last one,
                # or two intruders seen by alternating replicas would be told again and again.
                .values(intruder_told=func.coalesce(claims.c.intruder_told, "\n") + f"{key}\n")
            )
            if done.rowcount != 1:
                return False
            told = self._get_in(c, claim_id)
            record(c, "intruder", ("gpubot", "gpubot"), told.node, now=now, claim=claim_id, key=key)
            return True

    async def keep(self, claim_id: int, chat_id: str, now: float, source: str) -> Claim | None:
        """Keep an idle claim (its holder only): its idle run starts anew."""
        return await in_thread(self._keep, claim_id, chat_id, now, source)

    def _advance_idle(self, updates: list[IdleUpdate]) -> None:
        with guard("cannot record idle claims"), write_tx(self._engine) as c:
            for claim_id, since, last, read in updates:
                now_last = c.execute(
                    select(claims.c.idle_last_at).where(claims.c.id == claim_id)
                ).scalar()
                if unix(now_last) != read:  # kept (or looked at elsewhere) since it was read
                    continue
                values: dict[str, str | None] = {
                    "idle_since": None if since is None else at(since),
                    "idle_last_at": at(last),
                }
                if since is None:
                    values["idle_dm_at"] = None
                c.execute(
                    claims.update()
                    .where(claims.c.id == claim_id, claims.c.state == ClaimState.ACTIVE.value)
                    .values(**values)
                )

    def _mark_idle_dm(self, claim_id: int, now: float) -> bool:
        with guard("cannot record the idle claim"), write_tx(self._engine) as c:
            done = c.execute(
                claims.update()
                .where(
                    claims.c.id == claim_id,
                    claims.c.state == ClaimState.ACTIVE.value,
                    claims.c.idle_dm_at.is_(None),
                )
                .values(idle_dm_at=at(now))
            )
            if done.rowcount != 1:
                return False
            asked = self._get_in(c, claim_id)
            record(c, "idle-asked", ("gpubot", "gpubot"), asked.node, now=now, claim=claim_id)
            return True

    def _keep(self, claim_id: int, chat_id: str, now: float, source: str) -> Claim | None:
        with guard("cannot record the keep"), write_tx(self._engine) as c:
            row = c.execute(select(claims.c.chat_id).where(claims.c.id == claim_id)).one_or_none()
            if row is None or row.chat_id != chat_id:
                return None
            done = c.execute(
                claims.update()
                .where(claims.c.id == claim_id, claims.c.state == ClaimState.ACTIVE.value)
                .values(idle_since=None, idle_last_at=None, idle_dm_at=None)
            )
            if done.rowcount != 1:
                return None
            kept = self._get_in(c, claim_id)
            record(c, "kept", (chat_id, source), kept.node, now=now, claim=claim_id)
            return kept
