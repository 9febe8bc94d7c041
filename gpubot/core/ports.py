"""Ports: what services need from the outside world (``typing.Protocol``)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from gpubot.core.lease import Fence, Lease
from gpubot.core.models import (
    ActionStatus,
    CommandResult,
    ComputeApp,
    GpuInfo,
    NodeConfig,
    NodeSnapshot,
)
from gpubot.core.reset.interrupted import Unfinished

if TYPE_CHECKING:  # types only: a short CLI call need not import the alerting and approvals
    from gpubot.core.alerting import (
        Alert,
        AlertGroup,
        Intent,
        Lookup,
        MessageRef,
        PendingPost,
        Posted,
    )
    from gpubot.core.findings import FindingKey
    from gpubot.core.health.findings import EccKey, EccSeen
    from gpubot.core.telemetry import CandidateRule
    from gpubot.core.usage.holder_runs import IdleNow, Looked
    from gpubot.core.usage.idle import GpuSample
    from gpubot.core.usage.idle_runs import RunRule

M_contra = TypeVar("M_contra", contravariant=True)  # a front end's message (``chat.Message``)


class Transport(Protocol):
    """Runs argv lists on nodes; raises ``TransportError`` subclasses, never library errors."""

    async def run(
        self, node: NodeConfig, argv: Sequence[str], *, timeout: float | None = None
    ) -> CommandResult:
        """Run ``argv`` on ``node`` (joined with ``shlex.join``) and return its result."""

    async def close(self) -> None: ...


class SlurmRest(Protocol):
    """The cluster's slurmrestd: GET a path, answer its HTTP status and its JSON document.

    Raises ``SlurmRestFailed`` (one line) when nothing usable came back: no connection, no
    answer in time, a body that is not JSON. An HTTP error with a JSON body is an answer."""

    url: str

    async def get(self, path: str) -> tuple[int, Any]: ...

    async def close(self) -> None: ...


class PromSource(Protocol):
    """The site's Prometheus: the summary's instant vectors by field (``core.telemetry``).

    Raises ``PrometheusFailed`` (one line) when any query gives nothing usable."""

    url: str

    async def summary_vectors(self) -> Mapping[str, list[dict[str, Any]]]: ...

    async def candidate_vectors(self, rule: CandidateRule) -> Mapping[str, list[dict[str, Any]]]:
        """A sweep's candidate vectors by reason (``core.telemetry.candidate_queries``)."""
        ...

    async def close(self) -> None: ...


NvmlTables = tuple[tuple[GpuInfo, ...], tuple[ComputeApp, ...]]


@runtime_checkable
class NvmlReader(Protocol):
    """A transport that can also read a node's GPUs through NVML (the local box)."""

    async def nvml_snapshot(self, node: NodeConfig) -> NvmlTables | None:
        """Return NVML's GPU and compute-app tables, or None to fall back to nvidia-smi."""


class Locks(Protocol):
    """Named leases that are never waited for: a held one raises ``LockHeld`` naming its holder.
    The block's ``Lease`` is renewed while it runs."""

    def hold(self, name: str, *, holder: str = "") -> AbstractAsyncContextManager[Lease]: ...


class Clock(Protocol):
    """Time, passed in: wall time is recorded and shown; deadlines and durations are monotonic."""

    def now(self) -> float: ...

    def monotonic(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class AuditStore(Protocol):
    """The append-only, hash-chained audit log. Every method raises ``StoreError`` on failure.

    ``fence`` is checked and extended in the write's transaction (``LeaseLost`` when gone), so a
    recorded step proves its writer held the lease. It is an explicit argument, not a context the
    store reads, so which writes are fenced is visible at each call and type-checked.
    """

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

    async def record_event(
        self, action_id: int, event: Mapping[str, Any], *, fence: Fence | None = None
    ) -> None: ...

    async def finish_action(
        self,
        action_id: int,
        *,
        status: ActionStatus,
        result: Mapping[str, Any],
        fence: Fence | None = None,
    ) -> None: ...

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
        """Append a brief record of a read-only query; with ``changed`` (sweeps) the nodes are
        counted, and only the changed ones named."""


class SampleStore(Protocol):
    """Per-GPU samples, each GPU's idle run and each process's holder run, advanced together.
    Every method raises ``StoreError`` on failure."""

    async def advance_idle(
        self,
        samples: Sequence[GpuSample],
        rule: RunRule,
        *,
        keep_from: float,
        looked: Looked | None = None,
    ) -> IdleNow:
        """Store one sweep's samples and advance the idle and holder runs in one transaction;
        return since when each GPU and holder has been idle, counting from ``keep_from``."""

    async def idle_since(
        self,
        samples: Sequence[GpuSample],
        rule: RunRule,
        *,
        keep_from: float,
        looked: Looked | None = None,
    ) -> IdleNow:
        """Return what ``advance_idle`` would, storing nothing."""

    async def add_samples(self, samples: Sequence[GpuSample]) -> None: ...

    async def samples_since(
        self, since: float, *, gpus: Collection[tuple[str, int]] | None = None
    ) -> list[GpuSample]:
        """Return the samples taken at or after ``since``, by node, GPU and time."""

    async def prune_samples(self, before: float, *, limit: int | None = None) -> int:
        """Delete at most ``limit`` samples before ``before``; return how many went."""


class EccStore(Protocol):
    """Each GPU's uncorrectable ECC counts as the last sweep saw them."""

    async def ecc_counts(self) -> dict[EccKey, EccSeen]: ...

    async def put_ecc(self, counts: Mapping[EccKey, EccSeen]) -> None:
        """Store ``counts`` (each replaces its GPU's)."""


class ResetObserver(Protocol):
    """Counts resets by how each GPU ended (the metrics): ``freed``, ``stuck``, ``refused``..."""

    def count_reset(self, outcome: str, n: int = 1) -> None: ...


class AlertStore(Protocol):
    """The alert state of sweep findings across sweeps (``core.alerting.Alert``), keyed by
    ``FindingKey``. Alerting, reminding, snoozing and resolving are audited. Every method
    raises ``StoreError`` on failure."""

    async def upsert_seen(self, keys: Iterable[FindingKey], now: datetime) -> Sequence[Alert]:
        """Record that a sweep at ``now`` saw ``keys``; return their state (new ones included)."""

    async def mark_alerted(self, key: FindingKey, *, ref: MessageRef, now: datetime) -> Alert: ...

    async def mark_reminded(self, key: FindingKey, now: datetime) -> Alert: ...

    async def snooze(self, key: FindingKey, until: datetime, *, by: str, now: datetime) -> Alert:
        """Silence alerts for ``key`` until ``until`` (kept if the finding comes back)."""

    async def mark_resolved(self, keys: Iterable[FindingKey], now: datetime) -> Sequence[Alert]:
        """Resolve the open findings among ``keys``; return those that were open."""

    async def open_alerts(self) -> Sequence[Alert]:
        """Return every unresolved finding, oldest first."""

    async def on_message(self, ref: MessageRef) -> Sequence[Alert]:
        """Return the findings alerted in one message (resolved ones too), oldest first."""


class OutboxStore(Protocol):
    """The one outbox's records (``store.outbox``): every post that must appear once is
    recorded before it is made, and changed only on the caller's take. Every method raises
    ``StoreError`` on failure."""

    async def begin(self, intent: Intent) -> PendingPost | None:
        """Record ``intent``; None: nothing to post (done, being done, or not due)."""

    async def take(self, token: str, stale_before: datetime, now: datetime) -> PendingPost | None:
        """Take a post pending on a take made at or before ``stale_before`` (None: not so)."""

    async def finish(
        self, post: PendingPost, ref: MessageRef, now: datetime, *, adopted: bool = False
    ) -> Sequence[FindingKey]:
        """Record where ``post`` is; return the findings it alerted."""

    async def cancel(self, post: PendingPost, now: datetime) -> None: ...

    async def abandon(self, post: PendingPost, why: str, now: datetime) -> None:
        """Give up on ``post`` (audited)."""

    async def note_repeat(self, token: str) -> None:
        """Record, before it is made, a post that may repeat the post ``token``."""

    async def pending(self, subject: str, *, under: bool = False) -> Sequence[PendingPost]:
        """Return the pending posts of ``subject`` (``under``: of the subjects under it)."""

    async def recorded(self, subject: str) -> bool:
        """Whether a post of the ``once`` subject ``subject`` was recorded."""


class AuditEntry(Protocol):
    """One record of the audit log, as read back."""

    @property
    def time(self) -> datetime: ...

    @property
    def actor(self) -> str: ...

    @property
    def source(self) -> str: ...

    @property
    def data(self) -> Any: ...


class AuditLog(AuditStore, Protocol):
    """The audit log, written and read back."""

    async def actions(self, *, node: str | None = None, limit: int = 50) -> Sequence[Any]:
        """Return action summaries, newest first (``id``, ``started_at``, ``actor``, ...)."""

    async def queries(
        self, *, actor: str | None = None, since: datetime | None = None, limit: int = 50
    ) -> Sequence[AuditEntry]: ...

    async def interrupted(self, nodes: Sequence[str] | None = None) -> Sequence[Unfinished]:
        """Return the unfinished actions (on ``nodes``) no one marked reviewed, newest first."""

    async def review_action(
        self, action_id: int, *, actor: str, source: str, note: str = ""
    ) -> AuditEntry:
        """Record that ``actor`` reviewed an interrupted action (``UsageError``: it cannot be)."""


@dataclass(frozen=True)
class DueDm:
    """A direct message handed over for the front end that reaches ``to`` (``DmDueStore``):
    ``body`` is the rendered message (``chat.message_codec``), ``subject`` its outbox name."""

    subject: str
    to: str
    body: str
    at: float


class DmDueStore(Protocol):
    """Direct messages due to people another process's front end reaches; raises
    ``StoreError``."""

    async def hand(self, dm: DueDm) -> bool:
        """Keep ``dm`` for the front end that reaches its person; False: one of its subject
        is kept already."""

    async def due(self) -> list[DueDm]:
        """Return every message kept, oldest first."""

    async def done(self, subject: str) -> None:
        """Forget the message of ``subject``: delivered, or given up."""


class Poster(Protocol[M_contra]):
    """The front end's side of the outbox: posts a neutral message carrying a token (unseen by
    people) where it goes, and finds it again by that token. ``to`` and the
    ``MessageRef`` returned are the front end's own names (a conversation; a message, whose
    thread a post may go to). Implementations log failures and never raise."""

    async def post(
        self, to: str, msg: M_contra, *, token: str, repeat_of: datetime | None = None
    ) -> Posted:
        """Post ``msg`` (``repeat_of``: saying it may repeat the post made then)."""

    async def find(self, to: str, token: str, since: datetime) -> Lookup:
        """Look for the post carrying ``token`` where it went, among those since ``since``."""

    async def direct(self, user: str) -> str | None:
        """Return the direct conversation with ``user`` (None: it cannot be opened)."""


class Notifier(Protocol):
    """Posts and updates alert messages; implementations log failures and never raise."""

    async def post(self, group: AlertGroup, *, token: str) -> Posted:
        """Post a new alert carrying ``token`` (unseen by people); say how the post ended."""

    async def find(self, token: str, since: datetime) -> Lookup:
        """Look for the alert that carries ``token`` among those posted since ``since``."""

    async def update(self, where: MessageRef, group: AlertGroup) -> None:
        """Replace an alert message by the group's current state."""

    async def remind(self, where: MessageRef, group: AlertGroup) -> None:
        """Remind of findings that persist (in the alert's thread)."""


SHOWN = 10  # lines a report shows; the rest are counted


@dataclass(frozen=True)
class Report:
    """Something the people who run gpubot are told once (the work a stopped gpubot left
    unfinished): a title, a head line, its items (one line each), and where to see them all."""

    title: str
    head: str
    lines: tuple[str, ...]
    more: str = ""  # after "… and N more", e.g. " (`gpubot audit list`)"

    def text(self) -> str:
        """Return the head and at most ``SHOWN`` lines, then how many more there are."""
        shown = list(self.lines[:SHOWN])
        if len(self.lines) > SHOWN:
            shown.append(f"… and {len(self.lines) - SHOWN} more{self.more}")
        return self.head + ":\n" + "\n".join(shown)


class Reporter(Protocol):
    """Tells the people who run gpubot something once; logs failures, never raises."""

    async def report(self, report: Report) -> None: ...


class SweepObserver(Protocol):
    """Receives each sweep's numbers (the metrics)."""

    def observe_sweep(
        self,
        snapshots: Sequence[NodeSnapshot],
        failed: Sequence[str],
        seconds: float,
        open_findings: Mapping[str, int],
    ) -> None: ...
