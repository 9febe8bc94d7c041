"""The composition root: ``build`` makes settings into adapters, services and duties, each once
and complete, in dependency order; the ``App`` hands them out and owns their lifecycle.

What a command does not use is not built (nor its library imported): the cold ``gpubot status``
(``cold=True``) builds the status service and the transport only, and opens the audit store in
a worker thread while the probe runs (``App.run``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from gpubot.app.front import FrontEnd, Publisher
from gpubot.app.sources import prom_source, restd_reader, slurm_rest
from gpubot.app.stores import OpeningStore, local_locks, locks_for, store_or_warn
from gpubot.config import Settings, config_path, load
from gpubot.core.clock import SYSTEM_CLOCK
from gpubot.core.ports import Clock, Locks, SlurmRest, Transport
from gpubot.lifecycle import Running, Serving, SweepHeap, serve_metrics, settle_heap
from gpubot.services.status import Sources, StatusService

# Imported where used: ``gpubot status`` needs the status service and the transport, not the
# chat flows, the reset, sweep and approval services or SQLAlchemy before its probe is out.
if TYPE_CHECKING:
    from gpubot.app.services import Parts
    from gpubot.chat.flows import Flows, Services
    from gpubot.metrics import Metrics
    from gpubot.scheduler import IntervalScheduler
    from gpubot.services.approvals import ApprovalService
    from gpubot.services.diag import DiagService
    from gpubot.services.doctor import DoctorParts, DoctorService
    from gpubot.services.reset import ResetService
    from gpubot.services.seals import SealService
    from gpubot.services.sweep import SweepService
    from gpubot.store import Store

T = TypeVar("T")

log = logging.getLogger("gpubot.app")  # one logger for the root, whichever module

_HEAD_START_TURNS = 8  # event-loop turns: the fan-out's layers of tasks, each starting the next


@dataclass
class App:
    """Everything the entry points hand out, built once by ``build``."""

    settings: Settings
    transport: Transport
    store: Store | None
    locks: Locks
    status: StatusService
    parts: Parts | None = None  # None: the cold path
    front: FrontEnd | None = None
    serving: Serving | None = None
    metrics: Metrics | None = None  # a serving gpubot's
    schedulers: tuple[IntervalScheduler, ...] = ()  # every periodic duty
    opening: OpeningStore | None = None  # the cold path: the store, while it opens
    environ: Mapping[str, str] = field(default_factory=dict)
    restd: SlurmRest | None = None  # the cluster's slurmrestd, where the settings name one
    _opened: asyncio.Future[Store | None] | None = None

    def _parts(self) -> Parts:
        if self.parts is None:
            raise RuntimeError("built for the cold status path: no reset, sweep or chat")
        return self.parts

    # The parts, for the entry points and the tests (see ``Parts``).
    @property
    def reset(self) -> ResetService:
        return self._parts().reset

    @property
    def sweep(self) -> SweepService:
        return self._parts().sweep

    @property
    def chat(self) -> Services:
        return self._parts().chat

    @property
    def approvals(self) -> ApprovalService | None:
        return self._parts().approvals

    @property
    def seals(self) -> SealService | None:
        return None if self.parts is None else self.parts.seals

    @property
    def heads(self) -> Publisher | None:
        return None if self.parts is None else self.parts.heads

    @property
    def flows(self) -> Flows:
        flows = self._parts().flows
        if flows is None:
            raise RuntimeError("built without a front end: no flows")
        return flows

    def diag(self) -> DiagService:
        """Return DCGM's diagnostic service over this app's transport, audit store and locks
        (the CLI's ``gpubot diag``; chat's runs through ``RequestService``)."""
        from gpubot.services.diag import DiagService

        if self.store is None:
            raise RuntimeError("built without an audit store: a diagnostic is always audited")
        return DiagService(self.settings, self.transport, self.store, self.status, self.locks)

    def scheduler(self, name: str) -> IntervalScheduler | None:
        """Return the duty ``name`` (sweep, audit-head, audit-seal, approval-expiry, claims,
        dm-due)."""
        return next((s for s in self.schedulers if s.name == name), None)

    def start(self) -> None:
        """Start every duty on the running loop."""
        for s in self.schedulers:
            s.start()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Running]:
        """Report interrupted work, serve the metrics, settle the heap, start every duty and
        the loop watch; stop them when the body ends. A database outage meanwhile is two lines
        in the log, not one per duty per turn."""
        from gpubot.store.outage import OUTAGE

        with OUTAGE.watched():
            if self.front is not None and self.store is not None:
                from gpubot.services.startup import report_interrupted

                told = self.front.reporter(self.settings)
                await report_interrupted(self.store, self.approvals, told, self.front.name)
            port = serve_metrics(self.metrics, self.settings, self.serving or Serving())
            if self.serving is not None and self.serving.settle_heap:
                settle_heap()
            self.start()
            # The stall gauge: how long anything holds the loop, from here on.
            watch = None if self.metrics is None else asyncio.create_task(self.metrics.watch_loop())
            try:
                yield Running(port)
            finally:
                if watch is not None:
                    watch.cancel()
                    with suppress(asyncio.CancelledError):
                        await watch
                for s in self.schedulers:
                    await s.stop()

    async def run(self, body: Callable[[App], Awaitable[T]]) -> T:
        """Run ``body``; on the cold path, while the store opens beside it. A store that cannot
        be used warns, as in ``build(need_store=False)``; ``DatabaseBehind`` (or any other
        failure to open) stops ``body`` before it answers and is raised."""
        if self.opening is None:
            return await body(self)
        task = asyncio.ensure_future(body(self))
        try:
            # The probe first: let its tasks reach the network before SQLAlchemy's import (in
            # the thread) competes with them for the interpreter.
            for _ in range(_HEAD_START_TURNS):
                await asyncio.sleep(0)
            loop = asyncio.get_running_loop()
            self._opened = loop.run_in_executor(
                None, store_or_warn, self.settings, self.environ, False
            )
            self.store = await asyncio.shield(self._opened)
        except BaseException:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise
        self.opening.opened(self.store)
        return await task

    async def close(self) -> None:
        """Stop the duties and the metrics; close connections, locks and the database."""
        for s in self.schedulers:
            await s.stop()
        if self.seals is not None:
            await self.seals.stop()  # the clean stop's seal, before the store closes
        if self.metrics is not None:
            self.metrics.close()
        await self.status.abandon()  # no round of probes left to meet its connections closing
        await self.transport.close()
        if self.restd is not None:
            await self.restd.close()
        if self.front is not None:
            await self.front.close()
        close_locks = getattr(self.locks, "close", None)
        if callable(close_locks):
            close_locks()
        opened = self._opened
        if opened is not None:  # the cold path: wait for it to finish opening, then close it
            await asyncio.wait([opened])  # cancelled meanwhile: its thread still ends
            if not opened.cancelled() and opened.exception() is None:
                self.store = opened.result()
        if self.store is not None:
            self.store.close()


def settings_from(cli_config: str | None, environ: Mapping[str, str]) -> Settings:
    """Load ``--config``, else ``$GPUBOT_CONFIG``, else ``./gpubot.toml``."""
    return load(config_path(cli_config, environ))


def doctor_service(settings: Settings, parts: DoctorParts) -> DoctorService:
    """Return the service ``gpubot doctor`` runs; nothing else is built. Its caller closes
    ``.transport``."""
    from gpubot.services.doctor import DoctorService
    from gpubot.transport import make_transport

    return DoctorService(settings, make_transport(settings.ssh), parts)


def _cold(settings: Settings, environ: Mapping[str, str], restd: SlurmRest | None) -> App:
    """The cold ``gpubot status``'s app: the status service and the transport only."""
    from gpubot.transport import make_transport

    opening = OpeningStore()
    transport = make_transport(settings.ssh, len(settings.nodes))
    status = StatusService(
        settings,
        transport,
        opening,
        sources=Sources(restd_reader(restd), prom_source(settings, environ)),
    )
    return App(
        settings,
        transport,
        None,
        local_locks(),
        status,
        opening=opening,
        environ=environ,
        restd=restd,
    )


def build(
    settings: Settings,
    environ: Mapping[str, str],
    *,
    need_store: bool,
    cold: bool = False,
    front: FrontEnd | None = None,
    serving: Serving | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> App:
    """Build the app; without ``need_store`` a database that fails only warns, except one that
    is behind (``DatabaseBehind``). ``clock``: what the duties run on."""
    from gpubot.transport import make_transport

    restd = slurm_rest(settings, environ)
    if cold:
        return _cold(settings, environ, restd)
    from gpubot.app.duties import duties
    from gpubot.app.services import Base, build_parts

    store = store_or_warn(settings, environ, need_store)
    transport = make_transport(settings.ssh, len(settings.nodes))
    metrics = heap = None
    if serving is not None:
        from gpubot.metrics import Metrics

        metrics = Metrics()
        heap = SweepHeap() if serving.settle_heap else None
    base = Base(
        settings,
        transport,
        store,
        locks_for(settings, store),
        metrics,
        heap,
        serving is not None,
        restd_reader(restd),
        prom_source(settings, environ),
    )
    parts = build_parts(base, front)
    return App(
        settings,
        transport,
        store,
        base.locks,
        parts.status,
        parts,
        front,
        serving,
        metrics,
        duties(parts, settings, serving, front, clock),
        environ=environ,
        restd=restd,
    )
