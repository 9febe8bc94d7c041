"""Status: what is on every GPU right now, for one node or a fleet, each node failing alone."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar, cast

from gpubot.config import Settings
from gpubot.core.admission import Admission
from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.enrich import (
    apply_enrichment,
    attribute,
    enrich_argv,
    enrich_target,
    parse_enrichment,
)
from gpubot.core.maint import WindowStore
from gpubot.core.models import NodeConfig, NodeSnapshot
from gpubot.core.ports import AuditStore, Clock, NvmlReader, NvmlTables, PromSource, Transport
from gpubot.core.probe.holders import Holders
from gpubot.core.probe.snapshot import NvmlKnown, parse_probe, probe_argv
from gpubot.core.reset.protect import Protection
from gpubot.core.slurm import SLURM
from gpubot.core.slurm.alloc import undeclared
from gpubot.core.telemetry import PROMETHEUS, PromNode
from gpubot.core.workload import Workload
from gpubot.errors import (
    CommandTimeout,
    GpubotError,
    NodeUnreachable,
    StoreError,
    UsageError,
)
from gpubot.services.offload import off_loop
from gpubot.services.prom_read import read_prometheus
from gpubot.services.slurm_read import RestdReader, SlurmReader

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class FleetStatus:
    """Snapshots of the nodes that answered, and the reason of each that did not."""

    snapshots: tuple[NodeSnapshot, ...]
    failed: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    timed_out: tuple[str, ...] = ()
    unreachable: tuple[str, ...] = ()  # failed to connect (``NodeUnreachable``)
    # A summary's nodes read from Prometheus (``core.telemetry``), and why others were not
    telemetry: tuple[PromNode, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.failed


@dataclass(frozen=True)
class FanOut(Generic[T]):
    """Results of one call per node, sorted into answers and failures."""

    ok: dict[str, T]
    failed: dict[str, GpubotError]


async def fan_out(
    nodes: Sequence[NodeConfig],
    call: Callable[[NodeConfig], Awaitable[T]],
    limit: int,
    *,
    budget_s: float | None = None,
    budget_name: str = "budget",
) -> FanOut[T]:
    """Run ``call`` on every node, at most ``limit`` at once; each node fails alone.

    ``budget_s`` counts from the start, waiting for a turn included. ``limit`` workers take the
    nodes in turn, not a task per node whose first steps would all run in one turn of the loop.
    """
    deadline = None if budget_s is None else asyncio.get_running_loop().time() + budget_s
    answers: dict[int, T] = {}
    errors: dict[int, GpubotError] = {}
    turns = iter(range(len(nodes)))
    gate = Admission(min(max(1, limit), len(nodes)))

    async def one(node: NodeConfig) -> T:
        cm = asyncio.timeout_at(deadline)
        try:
            async with cm:
                return await call(node)
        except TimeoutError:
            if cm.expired():
                why = f"no answer within the {budget_name} ({round(budget_s or 0.0, 1):g} s)"
                raise CommandTimeout(node.name, why) from None
            raise

    async def worker() -> None:
        while True:
            async with gate.place():  # a node's turn is taken with its place, not before
                i = next(turns, None)
                if i is None:
                    return
                try:
                    answers[i] = await one(nodes[i])
                except GpubotError as exc:
                    errors[i] = exc
                except Exception as exc:  # cancellation and interrupts are not a node's failure
                    log.error("unexpected error from %s", nodes[i].name, exc_info=exc)
                    errors[i] = GpubotError(f"{nodes[i].name}: internal error: {exc!r}")

    watch = asyncio.ensure_future(gate.watch())
    try:
        ends = await asyncio.gather(*(worker() for _ in range(gate.limit)), return_exceptions=True)
    finally:
        watch.cancel()
    log.debug("fan-out: %d at once at most, of %d", gate.most, gate.limit)
    for end in ends:
        if isinstance(end, BaseException):
            raise end
    ok = {nodes[i].name: answers[i] for i in sorted(answers)}
    failed = {nodes[i].name: errors[i] for i in sorted(errors)}
    return FanOut(ok, failed)


def reason(exc: GpubotError, node: str) -> str:
    """Return the one-line reason of a node's failure, without repeating the node's name."""
    text = str(exc)
    return text[len(node) + 2 :] if text.startswith(f"{node}: ") else text


@dataclass(frozen=True)
class Sources:
    """What a status reads beside the nodes' own answers."""

    restd: RestdReader | None = None  # a Slurm cluster's slurmrestd
    prom: PromSource | None = None  # the site's Prometheus
    maint: WindowStore | None = None  # the maintenance windows


class StatusService:
    """Reads nodes through the transport; the same service serves the CLI, the console and Slack."""

    def __init__(
        self,
        settings: Settings,
        transport: Transport,
        store: AuditStore | None = None,
        *,
        decorators: Sequence[Callable[[NodeSnapshot], NodeSnapshot]] = (),
        heap: Callable[[], AbstractContextManager[object]] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        sources: Sources = Sources(),
    ) -> None:
        self.settings = settings
        self.maint = sources.maint  # the maintenance windows each fleet answer names
        # The site's Prometheus: the summary of nodes whose telemetry is "prometheus"
        self.prom = sources.prom
        self.transport = transport
        self.store = store
        self.clock = clock
        # What Slurm says of a Slurm node, read beside its probe (slurmrestd, or the node's SSH).
        self.slurm = SlurmReader(transport, settings.slurm, sources.restd)
        # Rounds of fleet probes in flight, by node list: identical requests share one.
        self._inflight: dict[tuple[str, ...], asyncio.Future[FleetStatus]] = {}
        self._summaries: dict[tuple[str, ...], asyncio.Future[FleetStatus]] = {}  # and summaries
        # What a status adds without asking the node, in order: what the sweeps know of each
        # GPU's health (services.health_checks' fields, services.xid_watch's Xids).
        self.decorators = list(decorators)
        # The collector around each round of fleet probes, as around sweeps (lifecycle.SweepHeap):
        # a large round sets off full passes that hold the loop.
        self.heap = heap

    def resolve(self, names: Sequence[str]) -> tuple[NodeConfig, ...]:
        if not self.settings.nodes:
            raise UsageError("no nodes configured (add [[nodes]] to the settings file)")
        if not names or "all" in names:
            return self.settings.nodes
        groups = self.settings.groups()
        wanted: set[str] = set()
        for name in names:
            if self.settings.node(name):
                wanted.add(name)
            elif name in groups:
                wanted.update(groups[name])
            else:
                raise UsageError(f"unknown node or group {name!r}")
        return tuple(n for n in self.settings.nodes if n.name in wanted)

    def node(self, name: str) -> NodeConfig:
        node = self.settings.node(name)
        if node is None:
            raise UsageError(f"unknown node {name!r}")
        return node

    async def snapshot(
        self,
        node: NodeConfig,
        *,
        gpu_indices: Sequence[int] | None = None,
        names: bool = True,
        holders: Holders = Holders.ALWAYS,
    ) -> NodeSnapshot:
        """Take one node's snapshot with one remote exec (NVML first on the local box).
        ``names``: ask its runtimes to name its workloads; a failed lookup never fails it."""
        timeout = self.settings.ssh.command_timeout_s
        # The probe runs two nvidia-smi queries one after the other: each gets half the time.
        smi_timeout = max(1.0, (timeout - 2.0) / 2)
        probe = probe_node(
            self.transport,
            node,
            smi_timeout_s=smi_timeout,
            taken_at=self.clock.now(),
            gpu_indices=gpu_indices,
            timeout=timeout,
            protection=self.settings.reset.protection,
            holders=holders,
        )
        if node.scheduler == SLURM:
            read = self.slurm.read(node, self.clock.now())
            snap, said = await asyncio.gather(probe, read)
            snap = replace(snap, slurm=said(snap))
        else:
            snap = await probe
        label = self.settings.attribution.container_owner_label
        named = await self.names(node, snap) if names and node.runtimes else {}
        return attribute(snap, label, named)

    async def names(
        self, node: NodeConfig, snap: NodeSnapshot
    ) -> dict[tuple[str, str, str], Workload]:
        cfg = self.settings.attribution
        workloads = {p.workload.key: p.workload for p in snap.processes if p.workload is not None}
        targets = {key: enrich_target(w) for key, w in workloads.items()}
        asked: dict[str, list[str]] = {}
        for t in targets.values():
            if t is not None and t[0] in node.runtimes and t[1] not in asked.get(t[0], []):
                asked.setdefault(t[0], []).append(t[1])

        async def one(runtime: str, ids: list[str]) -> dict[str, Any]:
            argv = enrich_argv(runtime, ids, timeout_s=cfg.lookup_timeout_s, sudo=node.sudo)
            try:
                res = await self.transport.run(node, argv, timeout=cfg.lookup_timeout_s + 3)
            except GpubotError as exc:
                log.info("%s: %s lookup failed: %s", node.name, runtime, exc)
                return {}
            if res.exit_status in (124, 137):  # timeout cut it: a cut output proves nothing
                log.info("%s: %s lookup timed out", node.name, runtime)
                return {}
            return dict(parse_enrichment(runtime, res.stdout, ids))

        found = dict(
            zip(asked, await asyncio.gather(*(one(r, i) for r, i in asked.items())), strict=True)
        )
        uid_names = {p.uid: p.user for p in snap.processes if p.uid is not None and p.user}
        out: dict[tuple[str, str, str], Workload] = {}
        for key, w in workloads.items():
            t = targets[key]
            if t is not None and t[0] in node.runtimes:
                rec = found.get(t[0], {}).get(t[1])
                out[key] = apply_enrichment(w, rec, cfg.container_owner_label, uid_names)
        return out

    async def fleet(
        self, names: Sequence[str] = ("all",), *, actor: str = "cli", source: str = "cli"
    ) -> FleetStatus:
        """Snapshot every named node concurrently; failures are reported per node. Calls for
        the same nodes while a round runs join it (a burst probes once); each records its own
        audit query."""
        nodes = self.resolve(names)
        started = self.clock.monotonic()
        status = await self._round(nodes)
        await self._record(nodes, status, actor, source, self.clock.monotonic() - started)
        return status

    async def summary(
        self, names: Sequence[str] = ("all",), *, actor: str = "cli", source: str = "cli"
    ) -> FleetStatus:
        """A fleet summary: nodes whose telemetry is "prometheus" from a few queries of the
        site's Prometheus, each GPU's age of data kept; the rest, and any node Prometheus did not
        answer for within ``[prometheus] max_age_s``, by SSH, with one note saying why. Calls for
        the same nodes while one runs join it, as ``fleet``'s do (a burst reads once)."""
        nodes = self.resolve(names)
        if not any(n.telemetry == PROMETHEUS for n in nodes):
            return await self.fleet(names, actor=actor, source=source)
        started = self.clock.monotonic()
        status = await self._joined(self._summaries, nodes, self._summary_round)
        await self._record(nodes, status, actor, source, self.clock.monotonic() - started)
        return status

    async def _summary_round(self, nodes: Sequence[NodeConfig]) -> FleetStatus:
        started = self.clock.monotonic()
        prom = [n for n in nodes if n.telemetry == PROMETHEUS]
        read, notes = await read_prometheus(self.prom, self.settings.prometheus, prom)
        rest = [n for n in nodes if n.name not in read]
        status = await self._round(rest) if rest else FleetStatus(())
        seconds = self.clock.monotonic() - started
        return replace(status, telemetry=tuple(read.values()), notes=tuple(notes), seconds=seconds)

    async def _record(
        self, nodes: Sequence[NodeConfig], status: FleetStatus, actor: str, source: str, s: float
    ) -> None:
        if self.store is None:
            return
        try:
            names = [n.name for n in nodes]
            await self.store.record_query(
                kind="status",
                actor=actor,
                source=source,
                nodes=names,
                failed=status.failed,
                seconds=s,
            )
        except StoreError as exc:  # a read-only query still answers; the gap is logged
            log.warning("status query not recorded in the audit log: %s", exc)

    async def _round(self, nodes: Sequence[NodeConfig]) -> FleetStatus:
        return await self._joined(self._inflight, nodes, self._probe_round)

    async def _joined(
        self,
        rounds: dict[tuple[str, ...], asyncio.Future[FleetStatus]],
        nodes: Sequence[NodeConfig],
        start: Callable[[Sequence[NodeConfig]], Awaitable[FleetStatus]],
    ) -> FleetStatus:
        """Join the round of ``rounds`` in flight for ``nodes``, else start one."""
        key = tuple(n.name for n in nodes)
        task = rounds.get(key)
        if task is None or task.done():  # a finished round is never reused: no stale answers
            task = asyncio.ensure_future(start(nodes))
            rounds[key] = task
            task.add_done_callback(lambda t: _round_done(rounds, key, t))
        return await asyncio.shield(task)  # one caller giving up does not cancel the others

    async def _status_snapshot(self, node: NodeConfig) -> NodeSnapshot:
        """A status's snapshot: fuser only where memory does not add up."""
        snap = await self.snapshot(node, holders=Holders.IF_UNEXPLAINED)
        for decorate in self.decorators:
            snap = decorate(snap)
        said = undeclared(snap, node.scheduler)  # Slurm seen where no scheduler is named
        return snap if said is None else replace(snap, notes=(*snap.notes, said))

    async def abandon(self) -> None:
        """Cancel the rounds in flight and wait for them, before the transport closes: a
        shielded round meeting its connections closing gets asyncssh's internal error."""
        rounds = [*self._summaries.values(), *self._inflight.values()]
        for task in rounds:
            task.cancel()
        await asyncio.gather(*rounds, return_exceptions=True)
        if self.prom is not None:
            await self.prom.close()

    async def _probe_round(self, nodes: Sequence[NodeConfig]) -> FleetStatus:
        started = self.clock.monotonic()
        with nullcontext() if self.heap is None else self.heap():
            res = await fan_out(nodes, self._status_snapshot, self.settings.ssh.max_parallel)
        seconds = self.clock.monotonic() - started
        # fan_out's answers are in the order of ``nodes``
        snaps = await self._with_windows(tuple(res.ok.values()))
        failed = {n: reason(e, n) for n, e in res.failed.items()}
        timed_out = tuple(n for n, e in res.failed.items() if isinstance(e, TimeoutError))
        down = tuple(n for n, e in res.failed.items() if isinstance(e, NodeUnreachable))
        return FleetStatus(snaps, failed, seconds, timed_out, down)

    async def _with_windows(self, snaps: tuple[NodeSnapshot, ...]) -> tuple[NodeSnapshot, ...]:
        """Name each node's maintenance windows, open or planned, in its notes (read once)."""
        if self.maint is None or not snaps:
            return snaps
        now = self.clock.now()
        try:
            windows = await self.maint.live(now)
        except StoreError as exc:
            log.warning("maintenance windows not read, not shown: %s", exc)
            return snaps
        said: dict[str, list[str]] = {}
        for w in windows:
            said.setdefault(w.node, []).append(w.shown(now))
        return tuple(replace(s, notes=(*s.notes, *said.get(s.node, ()))) for s in snaps)


def _round_done(
    rounds: dict[tuple[str, ...], asyncio.Future[FleetStatus]],
    key: tuple[str, ...],
    task: asyncio.Future[FleetStatus],
) -> None:
    if rounds.get(key) is task:
        del rounds[key]
    if not task.cancelled():
        task.exception()  # retrieved: no "never retrieved" log if every caller gave up


@functools.cache
def _reads_nvml(kind: type) -> bool:
    """Whether a transport of ``kind`` reads NVML, asked once per kind: a runtime Protocol's
    check is slow, and a sweep asks for every node."""
    return issubclass(kind, NvmlReader)


async def probe_node(
    transport: Transport,
    node: NodeConfig,
    *,
    smi_timeout_s: float,
    taken_at: float,
    gpu_indices: Sequence[int] | None = None,
    timeout: float | None = None,
    protection: Protection | None = None,
    holders: Holders = Holders.ALWAYS,
) -> NodeSnapshot:
    nvml: NvmlTables | None = None
    if _reads_nvml(type(transport)):
        nvml = await cast(NvmlReader, transport).nvml_snapshot(node)
    if nvml is not None:
        gpus, apps = nvml
        if gpu_indices is not None:
            wanted = set(gpu_indices)
            gpus = tuple(g for g in gpus if g.index in wanted)
            uuids = {g.uuid for g in gpus}
            apps = tuple(a for a in apps if a.gpu_uuid in uuids)
        nvml = (gpus, apps)
        known = NvmlKnown(
            [g.index for g in gpus],
            pids=[a.pid for a in apps],
            minors=[g.minor for g in gpus if g.minor is not None],
        )
        argv = probe_argv(node, smi_timeout_s=smi_timeout_s, nvml=known)
    else:
        argv = probe_argv(
            node, smi_timeout_s=smi_timeout_s, gpu_indices=gpu_indices, holders=holders
        )
    result = await transport.run(node, argv, timeout=timeout)
    # in the worker thread: answers arriving together would hold the loop (services.offload)
    return await off_loop(parse_probe, node, result, taken_at, nvml=nvml, protection=protection)
