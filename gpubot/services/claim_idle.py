"""Idle claims: a claimed GPU at 0 % for ``claim_idle_minutes`` gets its holder a DM with Keep /
Release; still idle as long again, the claim is released and audited. Idle time is each claim's
idle run, stored with the claim, never a history of samples.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gpubot.core.claims.ports import ClaimStore
from gpubot.core.claims.rules import Claim, ClaimSettings, idle_rule, idle_step
from gpubot.core.durations import TIME_SLACK_S
from gpubot.core.usage.idle import samples_of
from gpubot.errors import DUTY_TURN, GpubotError, StoreError
from gpubot.services.status import StatusService

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IdleAsked:
    """Ask the holder of an idle claim: Keep or Release."""

    claim: Claim
    idle_s: float


@dataclass(frozen=True)
class IdleReleased:
    """An idle claim no one kept was released."""

    claim: Claim
    idle_s: float


async def idle_claims(
    config: ClaimSettings, store: ClaimStore, status: StatusService, now: float
) -> list[IdleAsked | IdleReleased]:
    """Advance every active claim's idle run by a look at its node; ask or release."""
    if config.claim_idle_minutes <= 0:
        return []
    # Times round-trip the store at microseconds: a look a whole period later may read a
    # hair short of it, as the sweep's idle window allows for too.
    rule, limit = idle_rule(config.every_s), config.claim_idle_minutes * 60 - TIME_SLACK_S
    by_node: dict[str, list[Claim]] = {}
    for c in await store.active():
        by_node.setdefault(c.node, []).append(c)
    updates: list[tuple[int, float | None, float, float | None]] = []
    out: list[IdleAsked | IdleReleased] = []
    for node, held in by_node.items():
        try:
            snap = await status.snapshot(status.node(node))
        except GpubotError as exc:  # unknown is not idle: this node waits for the next look
            log.warning("idle claims of %s not looked at: %s", node, exc, extra=DUTY_TURN)
            continue
        looks = {s.gpu: s for s in samples_of([snap], now)}
        for c in held:
            look = looks.get(c.gpu)
            if look is None or look.uuid != c.gpu_uuid:
                continue
            since, last = idle_step(c, look, rule)
            updates.append((c.id, since, last, c.idle_last_at))
            if since is None:
                continue
            try:
                out += await _ask_or_release(store, c, now - max(since, c.start), limit, now)
            except StoreError as exc:  # what was asked or released so far is still told
                log.warning("idle claim %s not asked or released: %s", c.id, exc)
    try:
        await store.advance_idle(updates)
    except StoreError as exc:  # the asks and releases above stand; the next look folds again
        log.warning("idle runs of claims not stored: %s", exc, extra=DUTY_TURN)
    return out


async def _ask_or_release(
    store: ClaimStore, c: Claim, idle_s: float, limit: float, now: float
) -> list[IdleAsked | IdleReleased]:
    """Ask the holder once the claim was idle ``limit``; release it ``limit`` after asking."""
    if c.idle_dm_at is None and idle_s >= limit:
        return [IdleAsked(c, idle_s)] if await store.mark_idle_dm(c.id, now) else []
    if c.idle_dm_at is not None and now - c.idle_dm_at >= limit:
        gone = await store.release(
            None,
            (c.node, (c.gpu,)),
            now=now,
            source="gpubot",
            why="released-idle",
            ids={c.id},
            asked_before=c.idle_dm_at,  # unless a Keep lands while we looked
        )
        return [IdleReleased(g, idle_s) for g in gone]
    return []
