"""The reclaim ladder: idle holders are told, reminded, named, then offered to on-call.

After every alerting sweep each idle holder takes the step due, recorded and audited first, then
told, so a step is told at most once, by one replica. Nothing here kills: *Free it* is a forced
reset the approval flow decides, with this service's evidence. A failing store or notifier costs
that step, never the sweep. The evidence reads samples only for a holder taking a step.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Protocol

from gpubot.core.alerting import SweepResult
from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.durations import TIME_SLACK_S
from gpubot.core.findings import Finding
from gpubot.core.health.hung import HUNG_BUSY
from gpubot.core.ports import Clock, SampleStore
from gpubot.core.usage.hours import UNKNOWN_USER
from gpubot.core.usage.ladder import (
    BusyEvidence,
    Evidence,
    LadderEvidence,
    LadderRule,
    Rung,
    Step,
    keep_reason,
    next_step,
)
from gpubot.errors import DUTY_TURN, GpubotError, NotPermitted, StoreError, UsageError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LadderNotice:
    """One step to tell: which, of which holder, its finding now and the evidence."""

    step: Step
    rung: Rung
    finding: Finding
    evidence: LadderEvidence


class LadderNotifier(Protocol):
    """Tells a step of the ladder (Slack: DMs and the alerts channel)."""

    async def tell(self, notice: LadderNotice) -> bool:
        """Tell one step; return whether it reached anyone (never raises)."""
        ...


class LadderStore(Protocol):
    """The ladder's rows (``store.ladder.DbLadder``): each change audited with it."""

    async def rungs(self) -> dict[str, Rung]: ...

    async def climb(
        self, rung: Rung, step: Step, now: float, detail: dict[str, object]
    ) -> Rung | None: ...

    async def keep(self, finding: str, by: str, reason: str, now: float) -> Rung: ...

    async def note(self, finding: str, what: str, by: str, detail: dict[str, object]) -> None: ...

    async def leave(self, findings: Sequence[str], now: float, why: str) -> list[Rung]: ...


@dataclass(eq=False)
class ReclaimLadder:
    """Moves idle holders up the ladder, one step per sweep at most."""

    rule: LadderRule
    store: LadderStore
    samples: SampleStore | None = None
    notifier: LadderNotifier | None = None
    _: KW_ONLY
    clock: Clock = SYSTEM_CLOCK
    _seen: dict[str, Finding] = field(default_factory=dict, init=False)  # the last sweep's idle

    @property
    def enabled(self) -> bool:
        return self.rule.enabled

    async def climb(self, result: SweepResult) -> list[LadderNotice]:
        """Take the step due of each idle holder of ``result``; return the steps told."""
        if not self.enabled:
            return []
        now = self.clock.now()
        idle = {f.key.text(): f for f in result.findings if f.kind.ladder}
        self._seen = idle
        try:
            rungs = await self.store.rungs()
            answered = {s.node for s in result.snapshots}
            gone = [k for k, r in rungs.items() if k not in idle and r.node in answered]
            if gone:
                await self.store.leave(gone, now, "no longer found (idle or hung)")
        except StoreError as exc:
            log.warning("reclaim ladder not moved: %s", exc, extra=DUTY_TURN)
            return []
        told = [await self._step(key, f, rungs.get(key), now) for key, f in idle.items()]
        return [n for n in told if n is not None]

    async def _step(
        self, key: str, f: Finding, rung: Rung | None, now: float
    ) -> LadderNotice | None:
        step = next_step(rung, self.rule, now)
        if step is None or f.gpu is None:
            return None
        evidence = await self.evidence_of(f, now)
        base = rung or Rung(key, f.node, f.gpu, f.owner or UNKNOWN_USER, step, now, now)
        try:
            reached = await self.store.climb(base, step, now, {"evidence": evidence.to_dict()})
        except StoreError as exc:
            log.warning("reclaim ladder of %s GPU %s: %s", f.node, f.gpu, exc, extra=DUTY_TURN)
            return None
        if reached is None:  # another replica took this step
            return None
        notice = LadderNotice(step, reached, f, evidence)
        if self.notifier is not None:
            await self.notifier.tell(notice)
        return notice

    async def evidence_of(self, f: Finding, now: float) -> LadderEvidence:
        """Return a holder's evidence: a hung one's finding line (its own run's looks); an idle
        one's from samples since its own run began only (the GPU's earlier samples are another
        job's evidence)."""
        if f.kind == HUNG_BUSY:
            return BusyEvidence(f.summary)
        idle_s = f.idle_s or 0.0
        if self.samples is None or f.gpu is None:
            return Evidence(idle_s, 0)
        since = now - idle_s - 1.0 if f.idle_since is None else f.idle_since - TIME_SLACK_S
        try:
            found = await self.samples.samples_since(since, gpus=[(f.node, f.gpu)])
        except StoreError as exc:
            log.warning(
                "idle evidence of %s GPU %s unavailable: %s", f.node, f.gpu, exc, extra=DUTY_TURN
            )
            return Evidence(idle_s, 0)
        mib = [s.memory_used_mib for s in found if s.memory_used_mib is not None]
        at = [s.taken_at for s in found]
        return Evidence(
            idle_s,
            len(found),
            min(at, default=None),
            max(at, default=None),
            min(mib, default=None),
            max(mib, default=None),
        )

    async def rung(self, finding: str) -> Rung:
        """Return the rung of ``finding``; raise ``UsageError`` when it is not on the ladder."""
        rung = (await self.store.rungs()).get(finding)
        if rung is None:
            raise UsageError("this GPU is no longer on the reclaim ladder")
        return rung

    async def keep(self, finding: str, *, by: str, user: str | None, reason: str) -> Rung:
        """Stop the ladder of ``finding`` (its owner only); ``reason`` is kept and audited."""
        try:
            why = keep_reason(reason)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        rung = await self.rung(finding)
        if user is None or user != rung.owner:
            raise NotPermitted(f"only {rung.owner}, whose job holds it, can keep this GPU")
        return await self.store.keep(finding, by, why, self.clock.now())

    async def free_asked(self, finding: str, *, by: str, evidence: LadderEvidence) -> None:
        try:
            await self.store.note(finding, "free asked", by, {"evidence": evidence.to_dict()})
        except GpubotError as exc:
            log.warning("reclaim ladder: cannot audit the Free it of %s: %s", finding, exc)

    async def evidence(self, finding: str) -> LadderEvidence:
        """Return the evidence of ``finding`` as this process's last sweep saw it."""
        f = self._seen.get(finding)
        if f is None:
            await self.rung(finding)  # not on the ladder at all: say so
            raise UsageError("no sweep has seen this holder since gpubot started: try again soon")
        return await self.evidence_of(f, self.clock.now())
