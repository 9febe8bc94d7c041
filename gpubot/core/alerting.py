"""What a sweep decides on each finding's alert state, and what it reports.

Pure (time passed in). A finding is confirmed once two sweeps in a row saw it; it then alerts,
reminds after ``reminder_s`` and resolves once two sweeps that could look no longer found it
(``hold_clears``); a person may snooze it. The state (``Alert``) is kept by the ``AlertStore``
port; the messages a ``Notifier`` posts carry ``AlertGroup``s.
"""

from __future__ import annotations

import secrets
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, NewType, Protocol

from gpubot.core import durations
from gpubot.core.findings import (
    IDLE_HOLDER,
    Finding,
    FindingKey,
    FindingKind,
    NodeFailure,
    SweepConfig,
)
from gpubot.core.health.kinds import BY_NAME, title_of
from gpubot.core.models import NodeSnapshot
from gpubot.core.reset.readiness import Readiness
from gpubot.core.timefmt import iso
from gpubot.core.usage.idle import gpu_hours_by_owner

CONFIRM_SWEEPS = 2  # a finding alerts only once this many sweeps in a row saw it
CLEAR_SWEEPS = 2  # an alerted finding resolves only once this many looking sweeps missed it
SNOOZE_S = (3600.0, 86400.0)  # the shortest and the longest snooze: an hour, a day

# Where a posted message is: made by the front end that posted it, read back only by it; the
# other layers store and pass it.
MessageRef = NewType("MessageRef", str)


class AlertState(Protocol):
    """What the decisions read of an ``Alert``."""

    @property
    def seen_count(self) -> int: ...
    @property
    def alerted_at(self) -> datetime | None: ...
    @property
    def reminded_at(self) -> datetime | None: ...
    @property
    def snoozed_until(self) -> datetime | None: ...
    @property
    def resolved_at(self) -> datetime | None: ...


@dataclass(frozen=True)
class Alert:
    """The alerting state of one finding across sweeps (what the ``AlertStore`` keeps)."""

    id: int
    key: FindingKey
    first_seen: datetime
    last_seen: datetime
    seen_count: int  # sweeps in a row that saw it (restarts at 1 when it comes back)
    alerted_at: datetime | None
    ref: MessageRef | None  # its alert message (None: none was posted)
    reminded_at: datetime | None
    snoozed_until: datetime | None
    resolved_at: datetime | None


class Notice(StrEnum):
    NONE = "none"
    ALERT = "alert"
    REMIND = "remind"


def confirmed(kind: str, state: AlertState) -> bool:
    """Whether a finding is real: seen in consecutive sweeps.

    An idle holder is found only once its GPU's samples span the idle window; it is confirmed
    like any other, so a process that has just started on a GPU held idle gets one interval.
    """
    listed = BY_NAME.get(kind)  # an event is real when first seen
    need = 1 if listed is not None and listed.event else CONFIRM_SWEEPS
    return state.resolved_at is None and state.seen_count >= need


def notice(kind: str, state: AlertState, now: datetime, config: SweepConfig) -> Notice:
    """Decide whether a finding seen by this sweep alerts, reminds, or stays quiet."""
    snoozed = state.snoozed_until is not None and now < state.snoozed_until
    if snoozed or not confirmed(kind, state):
        return Notice.NONE
    if state.alerted_at is None:
        return Notice.ALERT
    last = max(state.alerted_at, state.reminded_at or state.alerted_at)
    due = last + timedelta(seconds=config.reminder_s)
    if state.snoozed_until is not None and state.snoozed_until > last:
        due = min(due, state.snoozed_until)  # a snooze that ended since: remind at its end
    return Notice.REMIND if now >= due else Notice.NONE


def to_resolve(
    open_keys: Iterable[FindingKey],
    found: Collection[FindingKey],
    *,
    answered: Collection[str],
    failed: Collection[str],
    configured: Collection[str],
) -> list[FindingKey]:
    """Return the open findings that cleared: not found again where the sweep could see.

    A GPU finding of a node that did not answer stays open (nobody looked); a node finding
    clears once the node answers or fails in another way; a node no longer configured clears.
    """
    out: list[FindingKey] = []
    for key in open_keys:
        if key in found:
            continue
        gone = key.node not in configured
        listed = BY_NAME.get(key.kind)
        looked = key.node in answered or (listed is not None and listed.node and key.node in failed)
        if gone or looked:
            out.append(key)
    return out


def hold_clears(
    cleared: Iterable[FindingKey],
    alerted: Collection[FindingKey],
    clearing: Mapping[FindingKey, int],
    *,
    unseen: Collection[FindingKey],
) -> tuple[list[FindingKey], dict[FindingKey, int]]:
    """Return the findings to resolve now, and how many sweeps each other one has cleared for.

    Hysteresis: an alerted finding resolves only once ``CLEAR_SWEEPS`` sweeps that
    looked (``to_resolve``'s ``cleared``) no longer found it, so that a finding missed once
    does not resolve and alert again. One never alerted resolves at once: it has no message
    to flap, and confirming it again takes two sweeps in a row. ``clearing``: the counts the
    previous sweep returned; a count carries over a sweep that could not look (``unseen``:
    open, neither found nor cleared) and is dropped when the finding is found again.
    """
    resolve: list[FindingKey] = []
    counts: dict[FindingKey, int] = {}
    for key in cleared:
        n = clearing.get(key, 0) + 1
        if key not in alerted or n >= CLEAR_SWEEPS:
            resolve.append(key)
        else:
            counts[key] = n
    counts.update({k: n for k, n in clearing.items() if k in unseen and k not in counts})
    return resolve, counts


def digest_label(keys: Iterable[FindingKey]) -> str:
    """Return the name of the message carrying ``keys``: its node, or for a digest of several
    nodes its kind and count (``node unreachable on 20 nodes``)."""
    keys = list(keys)
    nodes = {k.node for k in keys}
    if len(nodes) == 1:
        return next(iter(nodes))
    kinds = {k.kind for k in keys}
    kind = next(iter(kinds)) if len(kinds) == 1 else ""
    title = title_of(kind) if kind else "findings"
    return f"{title} on {len(nodes)} nodes"


def by_message(findings: Iterable[Finding]) -> dict[str, list[Finding]]:
    """Group the findings to alert on into messages, at most one per finding kind.

    A kind found on several nodes is one digest message (a rack outage is one message); the
    kinds found on one node only share that node's message. Keyed by ``digest_label``.
    """
    fs = list(findings)
    nodes_of: dict[FindingKind, set[str]] = {}
    for f in fs:
        nodes_of.setdefault(f.kind, set()).add(f.node)
    groups: dict[str, list[Finding]] = {}
    for f in fs:
        wide = len(nodes_of[f.kind]) > 1
        groups.setdefault(f.kind.value if wide else f"node:{f.node}", []).append(f)
    return {digest_label(f.key for f in g): g for g in groups.values()}


def snooze_until(now: datetime, choice: str) -> datetime:
    """Return when a snooze of ``choice`` (a duration within ``SNOOZE_S``) ends; raise a
    one-line ``ValueError`` otherwise."""
    low, high = SNOOZE_S
    try:
        seconds = durations.parse(choice)
    except durations.DurationError:
        seconds = 0.0
    if not low <= seconds <= high:
        span = f"{durations.format(low)} to {durations.format(high)}"
        raise ValueError(f"bad snooze {choice!r}: expected a duration from {span}")
    return now + timedelta(seconds=seconds)


# --- what the front ends get -------------------------------------------------------------------


@dataclass(frozen=True)
class AlertItem:
    """One finding of an alert message, as it stands now."""

    key: FindingKey
    finding: Finding | None  # None: only the key is known (seen by another replica or run)
    first_seen: datetime
    resolved_at: datetime | None = None
    snoozed_until: datetime | None = None
    readiness: Readiness | None = None


@dataclass(frozen=True)
class AlertGroup:
    """The findings of one node in one alert message (its per-GPU table when known)."""

    node: str
    items: tuple[AlertItem, ...]
    snapshot: NodeSnapshot | None
    at: datetime
    repeat_of: datetime | None = None  # may repeat the alert posted then (history unreadable)
    # The nodes Slurm owns (``scheduler = "slurm"``): their findings may offer a Drain button.
    slurm_nodes: frozenset[str] = frozenset()

    @property
    def open(self) -> tuple[AlertItem, ...]:
        return tuple(i for i in self.items if i.resolved_at is None)


# --- the outbox: what must appear once is posted once ---------------------------------------------

MAX_REPEATS = 1  # posts made without proof that the earlier one is not there


def new_token() -> str:
    """Return a fresh client token for one post (it rides in the message, unseen by people)."""
    return secrets.token_hex(16)


class Delivery(StrEnum):
    """How a post ended: the front end took it, refused it, or nobody knows (a timeout)."""

    POSTED = "posted"
    REFUSED = "refused"
    UNCERTAIN = "uncertain"


@dataclass(frozen=True)
class Posted:
    delivery: Delivery
    ref: MessageRef | None = None
    why: str = ""


@dataclass(frozen=True)
class Lookup:
    """What a search of the history for a post's token found (``checked`` False: the history
    could not be read: no scope, an error, too long to page)."""

    checked: bool
    ref: MessageRef | None = None
    why: str = ""


@dataclass(frozen=True)
class Intent:
    """A post to record before it is made (``OutboxStore.begin``).

    ``keys``: an alert's findings, marked alerted with it. ``once``: one row for ``subject``
    ever; with ``retake_before`` one refused, given up, or pending since before then, is taken
    again (a DM due until it is delivered). An approval's subject (``core.approval.posts``)
    is recorded only while its approval is in the state for it.
    """

    subject: str
    at: datetime
    to: str | None = None  # where it goes, as the front end names it (None: the alerts channel)
    keys: tuple[FindingKey, ...] = ()
    once: bool = False
    retake_before: datetime | None = None
    audit: Mapping[str, Any] | None = None
    token: str = field(default_factory=new_token)


@dataclass(frozen=True)
class PendingPost:
    """A post recorded before it was made (the outbox row), not yet known posted."""

    token: str
    subject: str
    keys: tuple[FindingKey, ...]
    since: datetime  # the history is searched from here
    created_at: datetime
    repeats: int = 0  # posts made with "this may repeat the message of …"
    taken_at: datetime | None = None  # when this caller took it (None: at created_at)
    to: str | None = None
    fresh: bool = True  # nothing of it can be there yet: posted without a search first
    audit: Mapping[str, Any] | None = None  # its intent's record: how it ended is audited too

    @property
    def take(self) -> datetime:
        """The take this caller holds: the store changes the row only while it is still this
        one, so a poster that lost its row (a replica took it over) changes nothing."""
        return self.created_at if self.taken_at is None else self.taken_at


class Next(StrEnum):
    """What to do with a pending post once the history was searched for it."""

    ADOPT = "adopt"  # it is there: record it, post nothing
    POST = "post"  # provably not there: post it (the same token)
    REPEAT = "repeat"  # cannot tell: post once, saying it may repeat
    GIVE_UP = "give-up"  # cannot tell, and one such post was made already


def next_step(pending: PendingPost, lookup: Lookup) -> Next:
    if lookup.ref is not None:
        return Next.ADOPT
    if lookup.checked:
        return Next.POST
    return Next.REPEAT if pending.repeats < MAX_REPEATS else Next.GIVE_UP


@dataclass(frozen=True)
class SweepResult:
    started_at: float  # unix time
    seconds: float
    nodes: tuple[str, ...]
    snapshots: tuple[NodeSnapshot, ...] = ()
    failed: dict[str, NodeFailure] = field(default_factory=dict)
    timed_out: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = ()
    readiness: dict[tuple[str, int], Readiness] = field(default_factory=dict)
    alerted: tuple[FindingKey, ...] = ()
    reminded: tuple[FindingKey, ...] = ()
    resolved: tuple[FindingKey, ...] = ()
    known: dict[FindingKey, Alert] = field(default_factory=dict)  # stored state of each finding
    skipped: str | None = None  # why this replica did not sweep
    # Nodes Prometheus vouched for, fresh, naming nothing on them: not probed this sweep; and
    # the nodes probed only because they were named, with who named them and why
    vouched: tuple[str, ...] = ()
    named: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()  # one line each: why nodes were swept over SSH after all

    @property
    def idle_gpu_hours(self) -> dict[str, float]:
        """Return the GPU-hours each owner's idle holders have held idle so far, most first."""
        return held_idle_hours(self.findings)

    @property
    def ok(self) -> bool:
        """Whether the sweep ran, every node answered, and nothing was found."""
        return self.skipped is None and not self.failed and not self.findings

    def to_dict(self) -> dict[str, Any]:
        """Return the ``--json`` document."""
        findings = []
        for f in self.findings:
            d = f.to_dict()
            ready = self.readiness.get((f.node, f.gpu)) if f.gpu is not None else None
            d["readiness"] = ready.to_dict() if ready else None
            state = self.known.get(f.key)
            d["alerted_at"] = iso(state.alerted_at) if state and state.alerted_at else None
            d["seen_count"] = state.seen_count if state else None
            findings.append(d)
        return {
            "started_at": iso(self.started_at),
            "seconds": round(self.seconds, 3),
            "skipped": self.skipped,
            "nodes": list(self.nodes),
            "answered": [s.node for s in self.snapshots],
            "failed": {
                n: {"kind": f.kind.value, "reason": f.reason} for n, f in self.failed.items()
            },
            "timed_out": list(self.timed_out),
            "vouched": list(self.vouched),
            "named": dict(self.named),
            "notes": list(self.notes),
            "findings": findings,
            "alerted": [k._asdict() for k in self.alerted],
            "reminded": [k._asdict() for k in self.reminded],
            "resolved": [k._asdict() for k in self.resolved],
            "idle_gpu_hours": {u: round(h, 2) for u, h in self.idle_gpu_hours.items()},
        }


def held_idle_hours(findings: Iterable[Finding]) -> dict[str, float]:
    """Return GPU-hours held idle per owner, from the idle-holder findings."""
    return gpu_hours_by_owner(
        (f.owner, f.node, f.gpu, f.idle_s)
        for f in findings
        if f.kind == IDLE_HOLDER and f.gpu is not None and f.idle_s is not None
    )
