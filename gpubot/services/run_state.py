"""What a reset in progress is and uses: its ports (``RunDeps``), its steps and how it talks to
the node (``RunState``). ``reset_run`` drives a reset on it; ``verify`` and ``workloads`` read
and extend it. None of them needs the ``ResetService`` that started the run.

Every step is recorded in the audit log before it is reported (a failure to record stops the
reset). The reset runs under the node's lease (``core.lease``): every record is fenced (the
store checks the lease in the write's transaction), and before each signal or command the lease
is checked and a ``sending`` step is written, so a holder that lost its lease stops before its
next signal.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpubot.config.settings import ResetSettings
from gpubot.core.lease import Lease
from gpubot.core.models import CommandResult, NodeConfig, NodeSnapshot, ResetStep
from gpubot.core.nodelog import Attribution, NodeLog, TargetName, find_marker, line, signal_what
from gpubot.core.ports import AuditStore, Clock, Transport
from gpubot.core.reset.cutoff import Sent, sent_items
from gpubot.core.reset.signals import (
    Identity,
    PidReport,
    PidStatus,
    parse_signal_output,
    signal_argv,
)
from gpubot.core.timefmt import iso
from gpubot.core.workload import Workload
from gpubot.services.status import StatusService

Pairs = dict[int, tuple[int, int]]  # planned pid -> (start_ticks, uid)


@dataclass(frozen=True)
class RunDeps:
    """What every reset uses: the transport, the snapshots, the audit log, the clock, the
    ``[reset]`` settings and how long one remote command may take."""

    transport: Transport
    snapshots: StatusService
    audit: AuditStore
    clock: Clock
    cfg: ResetSettings
    command_timeout_s: float


@dataclass(frozen=True)
class ResetEvent:
    """One step of a reset, as it happens (``ResetStep``: planned, signal, exited, ...)."""

    kind: ResetStep
    at: float
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "at": iso(self.at, timespec="milliseconds"), **self.data}


EventSink = Callable[[ResetEvent], Awaitable[None]]


class RunState:
    """State of one reset in progress: its steps, what the node said, and how it talks to the
    node (each signal identity-checked there)."""

    def __init__(
        self,
        deps: RunDeps,
        node: NodeConfig,
        action_id: int,
        sink: EventSink | None,
        lease: Lease | None = None,
        *,
        attribution: Attribution | None = None,
        kind: str = "reset",
    ) -> None:
        self.deps = deps
        self.clock = deps.clock  # every wait and step time reads it
        self.cfg = deps.cfg
        self.node = node
        self.action_id = action_id
        self.sink = sink
        self.lease = lease
        self.steps: list[ResetEvent] = []
        self.last_snapshot: NodeSnapshot | None = None
        self.refused: dict[int, str] = {}  # planned pids the node's identity check refused, why
        self.respawned: dict[int, Workload] = {}  # GPU -> the workload that took it again
        self.alive_at: dict[int, str] = {}  # target pid -> when a check last saw it alive
        # The node's log line of each action (None: none written), its kind and its GPUs.
        self.attribution = attribution
        self.kind = kind
        self.gpus: tuple[int, ...] = ()
        self.names: dict[int, TargetName] = {}  # planned pid -> how the log line names it

    def note(self, what: str, gpus: Sequence[int] | None = None) -> str:
        """Return the node's log line of an action (``nodelog.line``); empty: write none."""
        if self.attribution is None:
            return ""
        return line(
            self.kind, self.node.name, self.gpus if gpus is None else gpus, what, self.attribution
        )

    async def logged(self, log: NodeLog) -> None:
        """Record what the node said of an action's log line (never stops the action)."""
        await self.emit(ResetStep.NODE_LOG, **log.to_dict())

    async def emit(self, kind: ResetStep, **data: Any) -> None:
        """Record a step in the audit log first (a failure stops the reset), then report it."""
        event = ResetEvent(kind, self.clock.now(), data)
        self.steps.append(event)
        fence = None if self.lease is None else self.lease.fence
        await self.deps.audit.record_event(self.action_id, event.to_dict(), fence=fence)
        if self.sink is not None:
            await self.sink(event)

    async def before_sending(self, **what: Any) -> None:
        """Check the lease, then record what is about to go out (fenced): raise if it is gone.

        The check here is what the renewal found (lost, or run out while the database did not
        answer); the fenced write then asks the database itself.
        """
        if self.lease is not None:
            self.lease.check()
        await self.emit(ResetStep.SENDING, **what)

    def sent(self) -> list[Sent]:
        return sent_items([s.to_dict() for s in self.steps], self.alive_at)

    async def remote(self, argv: Sequence[str]) -> CommandResult:
        return await self.deps.transport.run(self.node, argv, timeout=self.deps.command_timeout_s)

    async def snapshot(
        self, *, gpu_indices: Sequence[int] | None = None, names: bool = True
    ) -> NodeSnapshot:
        return await self.deps.snapshots.snapshot(self.node, gpu_indices=gpu_indices, names=names)

    async def signal(self, sig: str, ids: Sequence[Identity]) -> dict[int, PidReport]:
        """Signal (or check) planned processes, identity checked on the node."""
        return (await self.signal_logged(sig, ids, ""))[0]

    async def signal_logged(
        self, sig: str, ids: Sequence[Identity], note: str
    ) -> tuple[dict[int, PidReport], NodeLog | None]:
        """Signal planned processes as ``signal`` does; with a ``note``, write it to the node's
        log in the same exec and return what logger said (None: no note)."""
        if not ids:
            return {}, None
        res = await self.remote(signal_argv(sig, ids, sudo=self.node.sudo, note=note))
        reports = parse_signal_output(res.stdout)
        return reports, find_marker(res.stdout, note) if note else None

    async def send(self, sig: str, pairs: Pairs, deaths: dict[int, float]) -> set[int]:
        note = ""
        if pairs:
            await self.before_sending(signal=f"SIG{sig}", pids=sorted(pairs))
            named = [self.names.get(p, TargetName(p, None, None)) for p in sorted(pairs)]
            note = self.note(signal_what(f"SIG{sig}", named))
        reports, log = await self.signal_logged(sig, ids_of(pairs, pairs), note)
        # What logger said rides on the exec's first signal step: no record of its own between
        # the signals and the grace wait (a lost lease or database is found where it was)
        said = {} if log is None else {"node_log": log.to_dict()}
        reached: set[int] = set()
        for pid, rep in sorted(reports.items()):
            why = {} if rep.why is None else {"why": rep.why}
            if rep.why is not None:
                self.refused[pid] = rep.why
            await self.emit(
                ResetStep.SIGNAL, pid=pid, signal=f"SIG{sig}", result=rep.status, **why, **said
            )
            said = {}
            if rep.status == PidStatus.SENT:
                reached.add(pid)
            elif rep.status == PidStatus.GONE:
                deaths.setdefault(pid, self.clock.monotonic())
        return reached

    async def wait_gone(
        self, alive: set[int], pairs: Pairs, deaths: dict[int, float], deadline: float
    ) -> set[int]:
        clock = self.clock
        alive = set(alive)
        while alive and clock.monotonic() < deadline:
            await clock.sleep(self.cfg.poll_interval_s)
            reports = await self.signal("check", ids_of(pairs, alive))
            now = clock.monotonic()
            for pid in sorted(alive):
                rep = reports.get(pid)
                if rep is not None and rep.status == PidStatus.ALIVE:
                    self.alive_at[pid] = iso(clock.now(), timespec="milliseconds")
                else:
                    alive.discard(pid)
                    deaths[pid] = now
                    await self.emit(ResetStep.EXITED, pid=pid)
        return alive


def ids_of(pairs: Pairs, pids: Iterable[int]) -> list[Identity]:
    """Return the identities of ``pids`` (pid, start ticks, uid), in pid order."""
    return [(p, *pairs[p]) for p in sorted(pids)]
