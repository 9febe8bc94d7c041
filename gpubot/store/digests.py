"""The weekly digest's outbox (``services.digest``): one row per period, its token, its end.

``begin`` inserts the period's row (the primary key makes one winner among replicas and
retries); a pending row is what a post whose end is unknown leaves, settled by looking for its
token in the channel. Every change is audited.
"""

from __future__ import annotations

from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError

from gpubot.core.usage.report import DigestPost
from gpubot.errors import StoreError
from gpubot.store.audit import append
from gpubot.store.engine import guard, read_tx, write_tx
from gpubot.store.idle_runs import text_of, unix_of
from gpubot.store.records import parse_iso
from gpubot.store.tables import usage_digests as t
from gpubot.store.waits import in_thread


class DbDigests:
    """The digest outbox; every method is async and raises ``StoreError``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    async def get(self, period: str) -> DigestPost | None:
        """Return the period's digest post, if one was begun."""
        return await in_thread(self._get, period)

    async def begin(self, period: str, token: str, now: float) -> bool:
        """Record the intent to post the period's digest; False: it was begun already."""
        return await in_thread(self._begin, period, token, now)

    async def finish(
        self, period: str, state: str, where: tuple[str, str] | None, now: float
    ) -> None:
        """Record how the post ended: posted (where), or refused (it may be begun again)."""
        await in_thread(self._finish, period, state, where, now)

    def _get(self, period: str) -> DigestPost | None:
        with guard("cannot read the digest outbox"), read_tx(self._engine) as conn:
            row = conn.execute(select(t).where(t.c.period == period)).one_or_none()
        if row is None:
            return None
        return DigestPost(row.period, row.token, row.state, unix_of(row.created_at))

    def _begin(self, period: str, token: str, now: float) -> bool:
        try:
            with guard("cannot record the digest post"), write_tx(self._engine) as conn:
                old = conn.execute(select(t.c.state).where(t.c.period == period)).scalar()
                if old == "refused":
                    conn.execute(
                        t.update()
                        .where(t.c.period == period)
                        .values(token=token, state="pending", created_at=text_of(now))
                    )
                    return True
                if old is not None:
                    return False
                conn.execute(
                    t.insert().values(
                        period=period, token=token, state="pending", created_at=text_of(now)
                    )
                )
                return True
        except StoreError as exc:
            if isinstance(exc.__cause__, IntegrityError):
                return False  # another replica recorded it first
            raise

    def _finish(self, period: str, state: str, where: tuple[str, str] | None, now: float) -> None:
        channel, ts = where or (None, None)
        with guard("cannot record the digest post's end"), write_tx(self._engine) as conn:
            conn.execute(
                t.update()
                .where(t.c.period == period)
                .values(state=state, channel=channel, message_ts=ts)
            )
            append(
                conn,
                kind="alert",
                actor="gpubot",
                source="gpubot",
                node=None,
                now=parse_iso(text_of(now)),
                payload={
                    "alert": f"digest {state}",
                    "period": period,
                    "channel": channel,
                    "message_ts": ts,
                },
            )
