"""The composition root: settings → adapters → services, each built once. Entry points call
``build``; front ends receive narrow parts of the ``App`` (never the ``App`` itself).

What a front end does not need is not built (nor its library imported): the Slack Web API
adapters only with ``slack=``, the scheduler, the audit head's publication, the audit seals'
schedule and the metrics only with ``serving=True`` (a forced reset is sealed in every front
end, when the audit log has its key). ``cold=True`` is the cold ``gpubot status``: the status
service and the transport only, the audit store opening in a worker thread while the probe
runs (``App.run``).

``async with app.running(reporter, options=Serving(...), expire=job):`` is the process
lifecycle, the same for every front end: it reports the work a stopped gpubot left unfinished
(through the ``Reporter`` port), serves the metrics, settles the heap, starts the schedules
(the sweep, the audit head and seals, the approval expiry: one scheduler) and the loop watch,
and stops them again on the way out.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from gpubot.app.services import Parts, wire_parts
from gpubot.app.stores import OpeningStore
from gpubot.config import Settings, audit_key, config_path, load
from gpubot.core.ports import Locks, Notifier, Reporter, Transport
from gpubot.errors import ConfigError, DatabaseBehind, StoreError
from gpubot.lifecycle import SERVING, Running, Serving, SweepHeap, serve_metrics, settle_heap
from gpubot.services.status import StatusService

# Imported where used: ``gpubot status`` needs the status service and the transport, not the
# chat flows, the reset, sweep and approval services or SQLAlchemy before its probe is out.
if TYPE_CHECKING:
    from gpubot.chat.flows import Services
    from gpubot.metrics import Metrics
    from gpubot.scheduler import IntervalScheduler
    from gpubot.services.approvals import ApprovalService
    from gpubot.services.reset import ResetService
    from gpubot.services.seals import SealService
    from gpubot.services.sweep import SweepService
    from gpubot.slack.api import SlackApi, SlackDirectory
    from gpubot.slack.heads import HeadPublisher
    from gpubot.slack.serve import SlackParts
    from gpubot.store import Store

__all__ = ["App", "Parts", "Running", "Serving", "SlackAccess", "build", "slack_parts"]

T = TypeVar("T")
Job = Callable[[], Awaitable[Any]]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlackAccess:
    """Where the Slack Web API is and the bot's token (read from the environment by serve)."""

    bot_token: str
    api_url: str


@dataclass
class App:
    """Everything the entry points hand out, wired once."""

    settings: Settings
    transport: Transport
    store: Store | None
    locks: Locks
    status: StatusService
    parts: Parts | None = None  # None: the cold path
    slack: SlackApi | None = None  # the Web API adapter, when built for Slack
    directory: SlackDirectory | None = None
    metrics: Metrics | None = None  # with serving=True
    schedulers: list[IntervalScheduler] = field(default_factory=list)  # with serving=True
    heads: HeadPublisher | None = None  # posts the audit head (serving, Slack, a store)
    seals: SealService | None = None  # the audit log's seals (serving, a store, its key)
    opening: OpeningStore | None = None  # the cold path: the store, while it opens
    environ: Mapping[str, str] = field(default_factory=dict)
    _opened: asyncio.Future[Store | None] | None = None

    def _parts(self) -> Parts:
        if self.parts is None:
            raise RuntimeError("built for the cold status path: no reset, sweep or chat")
        return self.parts

    @property
    def reset(self) -> ResetService:
        """The reset engine."""
        return self._parts().reset

    @property
    def sweep(self) -> SweepService:
        """The sweep."""
        return self._parts().sweep

    @property
    def chat(self) -> Services:
        """What the chat flows call."""
        return self._parts().chat

    @property
    def approvals(self) -> ApprovalService | None:
        """The approvals service (None without a store)."""
        return self._parts().approvals

    def scheduler(self, name: str) -> IntervalScheduler | None:
        """Return the schedule ``name`` (sweep, audit-head, audit-seal, approval-expiry), if any."""
        return next((s for s in self.schedulers if s.name == name), None)

    def start(self, *, sweeps: bool = True) -> None:
        """Start the schedules (the sweep unless ``sweeps`` is False): on the running loop."""
        for s in self.schedulers:
            if sweeps or s.name != "sweep":
                s.start()

    @asynccontextmanager
    async def running(
        self,
        reporter: Reporter | None = None,
        *,
        options: Serving = SERVING,
        expire: Job | None = None,
    ) -> AsyncIterator[Running]:
        """Run the lifecycle around the body: report interrupted work to ``reporter``, serve
        the metrics, settle the heap, start the schedules (``expire``: the approval expiry's
        job, every ``expire_every_s``) and the loop watch; stop them when the body ends. A
        database outage meanwhile is two lines in the log, not one per duty per turn."""
        from gpubot.store.outage import OUTAGE

        with OUTAGE.watched():
            async with self._running(reporter, options, expire) as running:
                yield running

    @asynccontextmanager
    async def _running(
        self, reporter: Reporter | None, options: Serving, expire: Job | None
    ) -> AsyncIterator[Running]:
        if reporter is not None and self.store is not None:
            from gpubot.services.startup import report_interrupted

            await report_interrupted(self.store, self.approvals, reporter)
        port = serve_metrics(self.metrics, self.settings, options)
        if options.settle_heap:
            settle_heap()
            heap = SweepHeap()  # and the survivors of each sweep and status round (issue 24)
            self.status.heap = heap.around
            if self.parts is not None:
                self.parts.sweep.heap = heap.around
        if expire is not None:
            self._add_schedule(
                expire, options.expire_every_s, "approval-expiry", 0.0, APPROVAL_STOP_WAIT_S
            )
        for job, every_s, name in options.duties:  # e.g. the claims' (issue 26)
            self._add_schedule(job, every_s, name, 0.0)
        self.start(sweeps=options.sweeps)
        # How long anything holds the loop, from here on (gpubot_event_loop_max_stall_seconds).
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

    def _add_schedule(
        self, job: Job, every_s: float, name: str, first: float | None, stop_wait_s: float = 30.0
    ) -> None:
        from gpubot.scheduler import IntervalScheduler

        self.schedulers.append(
            IntervalScheduler(job, every_s, first_after_s=first, stop_wait_s=stop_wait_s, name=name)
        )

    async def run(self, body: Callable[[App], Awaitable[T]]) -> T:
        """Run ``body``; on the cold path, while the store opens beside it.

        The store fails as in ``build(need_store=False)``: a database that cannot be used warns
        and the query is not recorded; ``DatabaseBehind`` (or any other failure to open) stops
        ``body`` before it answers and is raised, as is a failure of ``body`` after the store's.
        """
        if self.opening is None:
            return await body(self)
        task = asyncio.ensure_future(body(self))
        try:
            # The probe first: let its tasks reach the network before SQLAlchemy's import (in
            # the thread) competes with them for the interpreter; it then runs while the nodes
            # work.
            for _ in range(_HEAD_START_TURNS):
                await asyncio.sleep(0)
            loop = asyncio.get_running_loop()
            self._opened = loop.run_in_executor(None, _store, self.settings, self.environ, False)
            self.store = await asyncio.shield(self._opened)
        except BaseException:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise
        self.opening.opened(self.store)
        return await task

    async def close(self) -> None:
        """Stop the schedules and the metrics, close connections (SSH, the Slack Web API's),
        locks and the database."""
        for s in self.schedulers:
            await s.stop()
        if self.seals is not None:
            await self.seals.stop()  # the clean stop's seal, before the store closes
        if self.metrics is not None:
            self.metrics.close()
        await self.status.abandon()  # no round of probes left to meet its connections closing
        await self.transport.close()
        if self.slack is not None:
            await self.slack.close()
        close_locks = getattr(self.locks, "close", None)
        if callable(close_locks):
            close_locks()
        await self._close_store()

    async def _close_store(self) -> None:
        opened = self._opened
        if opened is not None:  # the cold path: wait for it to finish opening, then close it
            await asyncio.wait([opened])  # cancelled meanwhile: its thread still ends
            if not opened.cancelled() and opened.exception() is None:
                self.store = opened.result()
        if self.store is not None:
            self.store.close()


# How long a stop lets the approval duty's run under way end: a retried reset runs in it, and
# cancelled it ends with SIGTERM sent, no SIGKILL and no verify (told as interrupted, never
# silent, but a person must check the node). 60 s covers the default ``[reset]``: a grace of
# 10 s, the SIGKILL's wait of 5 s and a verify of up to 30 s. A longer grace (up to
# ``MAX_GRACE_S``, 600 s) is cut: the stop stays under systemd's ``TimeoutStopSec=90s``
# (deploy/gpubot.service), whose SIGKILL would cut it as well and lose the clean stop's seal.
APPROVAL_STOP_WAIT_S = 60.0

_HEAD_START_TURNS = 8  # event-loop turns: the fan-out's layers of tasks, each starting the next


def settings_from(cli_config: str | None, environ: Mapping[str, str]) -> Settings:
    """Load the settings file chosen by ``--config`` / ``$GPUBOT_CONFIG`` / ``./gpubot.toml``."""
    return load(config_path(cli_config, environ))


def doctor_transport(settings: Settings) -> Transport:
    """Return the transport ``gpubot doctor`` asks nodes through (nothing else is built)."""
    from gpubot.transport import make_transport

    return make_transport(settings.ssh)


def open_app_store(
    settings: Settings, environ: Mapping[str, str], *, check_schema: bool = True
) -> Store:
    """Open the audit store; raises ``StoreError`` (``DatabaseBehind`` says how to fix it).

    ``$GPUBOT_DB_PASSWORD`` is the database password, ``$GPUBOT_AUDIT_KEY`` the chain's key.
    ``check_schema`` False: also a database that is behind (``gpubot db`` migrates it).
    """
    from gpubot.store import open_store  # SQLAlchemy: only once a store is wanted

    return open_store(
        settings.database_url,
        password=environ.get("GPUBOT_DB_PASSWORD") or None,
        audit_key=audit_key(environ),
        check_schema=check_schema,
        head_file=settings.audit.head_file,
    )


def build(
    settings: Settings,
    environ: Mapping[str, str],
    *,
    need_store: bool,
    cold: bool = False,
    slack: SlackAccess | None = None,
    serving: bool = False,
    notifier: Notifier | None = None,
    first_after_s: float | None = None,
) -> App:
    """Wire adapters and services; without ``need_store`` a database that fails only warns.

    A schema that is not set up (``DatabaseBehind``) always stops us: it is fixed once, by
    ``gpubot db upgrade``, not worked around on every call. ``cold``: only what ``gpubot
    status`` needs, the store opening while ``App.run``'s body probes. ``slack``: build the Web
    API adapters (directory, alerts, the audit head's poster). ``serving``: also the sweep and
    audit-head schedules and the metrics. ``notifier``: where sweep alerts go, when not Slack
    (the demo prints them). ``first_after_s``: when the schedules first run (default: a few
    seconds after start). Raises ``ConfigError`` for bad settings.
    """
    from gpubot.transport import make_transport

    if cold:
        opening = OpeningStore()
        transport = make_transport(settings.ssh, len(settings.nodes))
        status = StatusService(settings, transport, opening)
        locks = _local_locks()
        return App(settings, transport, None, locks, status, opening=opening, environ=environ)
    store = _store(settings, environ, need_store)
    transport = make_transport(settings.ssh, len(settings.nodes))
    status = StatusService(settings, transport, store)
    app = App(settings, transport, store, _locks(settings, store), status)
    app.metrics = _metrics() if serving else None
    if slack is not None:
        notifier = notifier or _slack(app, slack)
    app.parts = wire_parts(app, notifier)
    app.seals = _seals(settings, store, app.reset)
    if serving:
        _schedule(app, first_after_s)
    return app


def slack_parts(app: App) -> SlackParts:
    """Return the narrow parts the Slack front end is given (``slack.serve.build_bot``)."""
    from gpubot.services.alert_keeper import NoAlerts
    from gpubot.slack.serve import SlackParts

    if app.slack is None:
        raise ConfigError("the app was built without Slack (build(..., slack=...))")
    outbox = app.store.alerts if app.store is not None else None  # the DMs, once (issue 22)
    return SlackParts(
        app.chat, app.slack, app.sweep.keeper or NoAlerts(), app.status, messages=outbox
    )


def _store(settings: Settings, environ: Mapping[str, str], need_store: bool) -> Store | None:
    try:
        return open_app_store(settings, environ)
    except DatabaseBehind:
        raise
    except StoreError as exc:
        if need_store:
            raise
        log.warning("audit log unavailable, this query is not recorded: %s", exc)
        return None


def _locks(settings: Settings, store: Store | None) -> Locks:
    if store is None:
        return _local_locks()
    from gpubot.store.leases import DbLeases

    cfg = settings.leases
    return DbLeases(store.engine, ttl_s=cfg.ttl_s, renew_s=cfg.renew_s, now=lambda: store.clock())


@functools.cache
def _local_locks() -> Locks:
    """Without a database: one registry of node locks per process."""
    from gpubot.services.locks import NodeLocks

    return NodeLocks()


def _metrics() -> Metrics:
    from gpubot.metrics import Metrics

    return Metrics()


def _slack(app: App, access: SlackAccess) -> Notifier | None:
    """Build the Web API adapters on ``app``; return the Slack notifier of sweep alerts, or None
    when no channel is configured."""
    from gpubot.slack.alerts import SlackAlerts, slack_users_of
    from gpubot.slack.api import SlackApi, SlackDirectory, make_client

    # One HTTP session (connection pool) for every Web API call; closed by App.close.
    app.slack = SlackApi(make_client(access.bot_token, access.api_url, shared_session=True))
    app.directory = SlackDirectory(app.slack.client)
    channel = app.settings.sweep.channel  # [alerts] channel, else [slack] channel
    if channel is None:
        log.warning("no [alerts] or [slack] channel: sweeps run, but nothing is posted")
        return None
    people = slack_users_of(app.settings.policy.users)
    outbox = app.store.alerts if app.store is not None else None  # each DM once (issue 22)
    return SlackAlerts(app.slack, channel, people=people, outbox=outbox)


def _schedule(app: App, first_after_s: float | None) -> None:
    """Build the sweep's schedule, the audit seals' (with their key) and, with Slack and a
    store, the audit head's publication."""
    from gpubot.scheduler import IntervalScheduler

    cfg = app.settings.sweep
    sweeps = IntervalScheduler(
        app.sweep.scheduled, cfg.interval_s, first_after_s=first_after_s, stop_wait_s=cfg.budget_s
    )
    app.schedulers = [sweeps]
    if app.seals is not None:
        app._add_schedule(app.seals.periodic, app.seals.every_s, "audit-seal", first_after_s)
    every = app.settings.audit.publish_head_every_s
    if every is None or app.store is None or app.slack is None:
        return
    channel = cfg.channel
    if channel is None:
        log.warning("no [alerts] or [slack] channel: the audit head is not published")
        return
    from gpubot.slack.heads import HeadPublisher

    app.heads = HeadPublisher(app.store, app.slack, channel)
    app._add_schedule(app.heads.publish, every, "audit-head", first_after_s)
    if app.seals is not None:
        app.seals.after_forced.append(app.heads.publish)  # a head outside the DB, at once


def _seals(settings: Settings, store: Store | None, reset: ResetService) -> SealService | None:
    """With a store and its key: the audit log's seals; a forced reset is sealed at its end
    (the CLI's too). ``gpubot serve`` also seals at start, every interval and at a clean stop
    (``_schedule``)."""
    every = settings.audit.seal_every_s
    if every is None or store is None:
        return None
    if store.audit_key is None:
        log.debug("the audit log is not sealed: seals need $GPUBOT_AUDIT_KEY")
        return None
    from gpubot.services.seals import SealService

    seals = SealService(store, every)
    reset.after_forced = seals.forced
    return seals
