"""The reclaim ladder of an idle holder: the steps, their delays, and the next one due.

A hung-but-busy holder (``core.health.hung``) climbs the same ladder, with its own evidence
(``BusyEvidence``): its owner is told and reminded before anyone else, and on-call's forced stop
is offered only at the last step. A holder climbs at most one step per sweep, each after its
delay since the step before:

1. ``DM``: a direct message to the owner (*Keep (reason)*, *Free it* for their own reset);
2. ``REMIND``: a reminder to the owner, ``remind_after`` after the DM;
3. ``POST``: a post in the alerts channel naming the holder, ``post_after`` after that;
4. ``OFFER``: a *Free it* button for on-call, ``offer_after`` after the post: a forced kill
   through the approval, with the idle evidence. Never an automatic kill.

The owner's *Keep (reason)* stops that holder's ladder for good (a new process starts anew); a
holder no longer idle leaves it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from gpubot.core.durations import TIME_SLACK_S
from gpubot.core.usage.report import utc_minute


class Step(IntEnum):
    """A step of the ladder (stored as its number)."""

    DM = 1
    REMIND = 2
    POST = 3
    OFFER = 4

    @property
    def label(self) -> str:
        """Return what the audit log calls this step."""
        return {1: "dm", 2: "reminder", 3: "channel post", 4: "free it offered"}[int(self)]


@dataclass(frozen=True)
class LadderRule:
    """Whether idle holders climb the ladder, and each step's delay after the one before."""

    enabled: bool = False
    remind_after_s: float = 7200.0
    post_after_s: float = 7200.0
    offer_after_s: float = 3600.0

    def delay(self, step: Step) -> float:
        """Return how long after the step before ``step`` comes (the DM: at once)."""
        return {
            Step.DM: 0.0,
            Step.REMIND: self.remind_after_s,
            Step.POST: self.post_after_s,
            Step.OFFER: self.offer_after_s,
        }[step]


@dataclass(frozen=True)
class Rung:
    """Where one idle holder stands: its finding, the step reached and when, and a *Keep*."""

    finding: str  # the idle-holder finding's key text
    node: str
    gpu: int
    owner: str
    step: Step
    started_at: float
    step_at: float
    kept_by: str | None = None
    kept_reason: str | None = None
    kept_at: float | None = None

    @property
    def kept(self) -> bool:
        return self.kept_at is not None


def next_step(rung: Rung | None, rule: LadderRule, now: float) -> Step | None:
    """Return the step due now for an idle holder at ``rung`` (None: none yet, or kept)."""
    if not rule.enabled:
        return None
    if rung is None:
        return Step.DM
    if rung.kept or rung.step is Step.OFFER:
        return None
    step = Step(rung.step + 1)
    return step if now - rung.step_at >= rule.delay(step) - TIME_SLACK_S else None


MAX_REASON = 300  # characters of a Keep reason


def keep_reason(text: str) -> str:
    """Return a *Keep* reason fit to store and show; raise ``ValueError`` for none."""
    reason = " ".join(text.split())
    if not reason:
        raise ValueError("say why the GPU is kept (a reason is required)")
    return reason[:MAX_REASON]


@dataclass(frozen=True)
class Evidence:
    """Why a GPU counts as held idle: for how long, and the samples that say so."""

    idle_s: float
    samples: int  # the GPU's samples in that time, every one at 0 %
    first_at: float | None = None
    last_at: float | None = None
    min_mib: int | None = None
    max_mib: int | None = None

    @property
    def gpu_hours(self) -> float:
        return self.idle_s / 3600.0

    def text(self) -> str:
        """Return the evidence as one line for a person (and the audit log)."""
        line = f"held idle {self.gpu_hours:.2f} GPU-hours: {self.samples} sample(s) at 0 %"
        if self.first_at is not None and self.last_at is not None:
            line += f" from {utc_minute(self.first_at)} to {utc_minute(self.last_at)} UTC"
        if self.min_mib is not None and self.max_mib is not None:
            most = "" if self.min_mib == self.max_mib else f"-{self.max_mib}"
            line += f", {self.min_mib}{most} MiB in use"
        return line

    def to_dict(self) -> dict[str, object]:
        """Return the evidence as the audit log keeps it."""
        return {
            "idle_gpu_hours": round(self.gpu_hours, 3),
            "samples": self.samples,
            "first_at": self.first_at,
            "last_at": self.last_at,
            "memory_mib": [self.min_mib, self.max_mib],
        }


@dataclass(frozen=True)
class BusyEvidence:
    """Why a holder looks hung though busy: its finding's own line (utilisation, power against
    the typical draw, memory, since when), as the sweep that found it said it."""

    line: str

    def text(self) -> str:
        return self.line

    def to_dict(self) -> dict[str, object]:
        return {"hung_busy": self.line}


LadderEvidence = Evidence | BusyEvidence
