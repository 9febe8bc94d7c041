"""The composition root: settings → adapters → services, each built once. Entry points call
``build``; front ends receive the ``App`` and never build or change a service.

What a front end does not need is not built (nor its library imported): the Slack Web API
adapters only with ``slack=``, the scheduler, the audit head's publication, the audit seals'
schedule and the metrics only with ``serving=True`` (a forced reset is sealed in every front
end, when the audit log has its key).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from gpubot.config import Settings, audit_key, config_path, load
from gpubot.core.lease import Fence
from gpubot.core.ports import AuditStore, Locks, Notifier, Transport
from gpubot.errors import DatabaseBehind, StoreError
from gpubot.services.status import StatusService

# Imported where used: ``gpubot status`` needs the status service and the transport, not the
# chat flows, the reset, sweep and approval services or SQLAlchemy before its probe is out.
if TYPE_CHECKING:
    from gpubot.chat.flows import Services
    from gpubot.metrics import Metrics
    from gpubot.scheduler import IntervalScheduler
    from gpubot.services.reset import ResetService
    from gpubot.services.seals import SealService
    from gpubot.services.sweep import SweepService
    from gpubot.slack.api import SlackApi
    from gpubot.slack.heads import HeadPublisher
    from gpubot.store import Store

T = TypeVar("T")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlackAccess:
    """Where the Slack Web API is and the bot's token (read from the environment by serve)."""

    bot_token: str
    api_url: str


@dataclass
class App:
    """Everything a front end needs, wired once."""

    settings: Settings
    transport: Transport
    store: Store | None
    locks: Locks
    status: StatusService
    reset: ResetService
    sweep: SweepService
    chat: Services  # what the chat front ends (Slack, console, demo) call
    slack: SlackApi | None = None  # the Web API adapter, when built for Slack
    metrics: Metrics | None = None  # with serving=True
    schedulers: list[IntervalScheduler] = field(default_factory=list)  # with serving=True
    heads: HeadPublisher | None = None  # posts the audit head (serving, Slack, a store)
    seals: SealService | None = None  # the audit log's seals (serving, a store, its key)

    def scheduler(self, name: str) -> IntervalScheduler | None:
        """Return the schedule called ``name`` ("sweep", "audit-head", "audit-seal"), if built."""
        return next((s for s in self.schedulers if s.name == name), None)

    def start(self, *, sweeps: bool = True) -> None:
        """Start the schedules (the sweep unless ``sweeps`` is False, the audit head's
        publication): call on the running event loop."""
        for s in self.schedulers:
            if sweeps or s.name != "sweep":
                s.start()

    async def close(self) -> None:
        """Stop the schedules and the metrics, close connections (SSH, the Slack Web API's),
        locks and the database."""
        for s in self.schedulers:
            await s.stop()
        if self.seals is not None:
            await self.seals.stop()  # the clean stop's seal, before the store closes
        if self.metrics is not None:
            self.metrics.close()
        await self.transport.close()
        if self.slack is not None:
            await self.slack.close()
        close_locks = getattr(self.locks, "close", None)
        if callable(close_locks):
            close_locks()
        if self.store is not None:
            self.store.close()


def settings_from(cli_config: str | None, environ: Mapping[str, str]) -> Settings:
    """Load the settings file chosen by ``--config`` / ``$GPUBOT_CONFIG`` / ``./gpubot.toml``."""
    return load(config_path(cli_config, environ))


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
    slack: SlackAccess | None = None,
    serving: bool = False,
    notifier: Notifier | None = None,
    first_after_s: float | None = None,
) -> App:
    """Wire adapters and services; without ``need_store`` a database that fails only warns.

    A schema that is not set up (``DatabaseBehind``) always stops us: it is fixed once, by
    ``gpubot db upgrade``, not worked around on every call. ``slack``: build the Web API
    adapters (directory, alerts, the audit head's poster). ``serving``: also the sweep and
    audit-head schedules and the metrics. ``notifier``: where sweep alerts go, when not Slack
    (the demo prints them). ``first_after_s``: when the schedules first run (default: a few
    seconds after start). Raises ``ConfigError`` for bad settings.
    """
    from gpubot.chat.alerts import chat_sweeper
    from gpubot.chat.flows import Services
    from gpubot.services.approvals import ApprovalPorts, ApprovalService
    from gpubot.services.directory import NoDirectory
    from gpubot.services.idle_accounting import no_idle_hours
    from gpubot.services.reset import ResetService
    from gpubot.transport import make_transport

    policy = settings.policy
    store = _store(settings, environ, need_store)
    transport = make_transport(settings.ssh)
    status = StatusService(settings, transport, store)
    audit: AuditStore = store if store is not None else _NoStore()
    # With a database, a node's reset and the sweep are exclusive across replicas and processes
    # (leases with fencing tokens, SQLite and PostgreSQL alike); one Locks for both.
    locks: Locks = _locks(settings, store)
    metrics = _metrics() if serving else None
    reset = ResetService(settings, transport, audit, status, locks, observer=metrics)
    api = directory = None
    if slack is not None:
        from gpubot.slack.api import SlackApi, SlackDirectory, make_client

        # One HTTP session (connection pool) for every Web API call; closed by App.close.
        api = SlackApi(make_client(slack.bot_token, slack.api_url, shared_session=True))
        directory = SlackDirectory(api.client)
        notifier = notifier or _slack_alerts(api, settings)
    sweep = _sweep(settings, status, transport, store, notifier, locks, metrics)
    approvals = None
    if store is not None:
        ports = ApprovalPorts(
            store.approvals, reset, status, locks, audit, directory or NoDirectory()
        )
        approvals = ApprovalService(policy, ports)
    idle_hours = no_idle_hours if sweep.idle is None else sweep.idle.gpu_hours
    chat = Services(settings, policy, status, approvals, store, chat_sweeper(sweep), idle_hours)
    app = App(settings, transport, store, locks, status, reset, sweep, chat, api, metrics)
    app.seals = _seals(settings, store, reset)
    if serving:
        _schedule(app, first_after_s)
    return app


@dataclass
class StatusApp:
    """What ``gpubot status`` needs: the transport and the status service. The audit store
    opens in a worker thread while the nodes are probed (``run``); the query is recorded once
    it is open."""

    settings: Settings
    environ: Mapping[str, str]
    transport: Transport
    status: StatusService
    audit: _OpeningStore
    store: Store | None = None  # once open (None: unusable, warned)
    _opening: asyncio.Future[Store | None] | None = None

    async def run(self, body: Callable[[StatusApp], Awaitable[T]]) -> T:
        """Run ``body`` while the store opens beside it; return what ``body`` returns.

        The store fails as in ``build(need_store=False)``: a database that cannot be used warns
        and the query is not recorded; ``DatabaseBehind`` (or any other failure to open) stops
        ``body`` before it answers and is raised, as is a failure of ``body`` after the store's.
        """
        task = asyncio.ensure_future(body(self))
        try:
            # The probe first: let its tasks reach the network before SQLAlchemy's import (in
            # the thread) competes with them for the interpreter; it then runs while the nodes
            # work.
            for _ in range(_HEAD_START_TURNS):
                await asyncio.sleep(0)
            loop = asyncio.get_running_loop()
            self._opening = loop.run_in_executor(None, _store, self.settings, self.environ, False)
            self.store = await asyncio.shield(self._opening)
        except BaseException:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise
        self.audit.opened(self.store)
        return await task

    async def close(self) -> None:
        """Close the connections and the store (waiting for it to finish opening)."""
        await self.transport.close()
        opening = self._opening
        if opening is None:
            return
        await asyncio.wait([opening])  # cancelled meanwhile: its thread still ends; close that
        if not opening.cancelled() and opening.exception() is None:
            store = opening.result()
            if store is not None:
                store.close()


_HEAD_START_TURNS = 8  # event-loop turns: the fan-out's layers of tasks, each starting the next


def build_status(settings: Settings, environ: Mapping[str, str]) -> StatusApp:
    """Wire what ``gpubot status`` needs; ``StatusApp.run`` opens the store as the probe runs."""
    from gpubot.transport import make_transport

    audit = _OpeningStore()
    transport = make_transport(settings.ssh)
    status = StatusService(settings, transport, audit)
    return StatusApp(settings, environ, transport, status, audit)


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
    from gpubot.services.reset import NodeLocks

    return NodeLocks()


def _metrics() -> Metrics:
    from gpubot.metrics import Metrics

    return Metrics()


def _slack_alerts(api: SlackApi, settings: Settings) -> Notifier | None:
    """Return the Slack notifier of sweep alerts, or None when no channel is configured."""
    from gpubot.slack.alerts import SlackAlerts, slack_users_of

    channel = settings.sweep.channel  # [alerts] channel, else [slack] channel
    if channel is None:
        log.warning("no [alerts] or [slack] channel: sweeps run, but nothing is posted")
        return None
    return SlackAlerts(api, channel, people=slack_users_of(settings.policy.users))


def _sweep(
    settings: Settings,
    status: StatusService,
    transport: Transport,
    store: Store | None,
    notifier: Notifier | None,
    locks: Locks,
    metrics: Metrics | None,
) -> SweepService:
    """Wire the sweep: with a store, its audit record, the alert keeper (alert state, the
    notifier, snooze) and the idle accounting (GPU samples)."""
    from gpubot.services.alert_keeper import AlertKeeper
    from gpubot.services.idle_accounting import IdleAccounting
    from gpubot.services.sweep import SweepPorts, SweepService

    if store is None:
        return SweepService(settings, status, transport, SweepPorts(locks=locks, observer=metrics))
    cfg = settings.sweep
    nodes = [n.name for n in settings.nodes]
    keeper = AlertKeeper(cfg, nodes, store.alerts, notifier)
    idle = IdleAccounting(cfg, settings.reset.protection, store.samples)
    ports = SweepPorts(store, keeper, idle, locks, metrics)
    return SweepService(settings, status, transport, ports)


def _schedule(app: App, first_after_s: float | None) -> None:
    """Build the sweep's schedule, the audit seals' (with their key) and, with Slack and a
    store, the audit head's publication."""
    from gpubot.scheduler import IntervalScheduler

    cfg = app.settings.sweep
    sweeps = IntervalScheduler(app.sweep.scheduled, cfg.interval_s, first_after_s=first_after_s,
                               stop_wait_s=cfg.budget_s)  # fmt: skip
    app.schedulers = [sweeps]
    if app.seals is not None:
        app.schedulers.append(
            IntervalScheduler(
                app.seals.periodic,
                app.seals.every_s,
                first_after_s=first_after_s,
                name="audit-seal",
            )
        )
    every = app.settings.audit.publish_head_every_s
    if every is None or app.store is None or app.slack is None:
        return
    channel = cfg.channel
    if channel is None:
        log.warning("no [alerts] or [slack] channel: the audit head is not published")
        return
    from gpubot.slack.heads import HeadPublisher

    app.heads = HeadPublisher(app.store, app.slack, channel)
    app.schedulers.append(IntervalScheduler(app.heads.publish, every, first_after_s=first_after_s,
                                            name="audit-head"))  # fmt: skip
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


class _OpeningStore:
    """The audit store while ``StatusApp.run`` opens it: a write waits until it is open; none
    is made when it could not be (that was warned)."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._store: AuditStore | None = None

    def opened(self, store: AuditStore | None) -> None:
        """Take the opened store (None: unusable) and let the waiting writes go."""
        self._store = store
        self._open.set()

    async def _ready(self) -> AuditStore:
        await self._open.wait()
        return self._store if self._store is not None else _NoStore()

    async def record_query(self, **query: Any) -> None:
        await self._open.wait()
        if self._store is not None:  # None: "not recorded" was said when it failed to open
            await self._store.record_query(**query)

    async def begin_action(self, **action: Any) -> int:
        return await (await self._ready()).begin_action(**action)

    async def record_event(
        self, action_id: int, event: Mapping[str, Any], *, fence: Fence | None = None
    ) -> None:
        await (await self._ready()).record_event(action_id, event, fence=fence)

    async def finish_action(self, action_id: int, **outcome: Any) -> None:
        await (await self._ready()).finish_action(action_id, **outcome)


class _NoStore:
    """Stands in when no store could be opened: every action is refused (fail closed)."""

    async def begin_action(self, **_: object) -> int:
        raise StoreError("the audit log is unavailable; nothing was done")

    async def record_event(self, *_: object, **__: object) -> None:
        raise StoreError("the audit log is unavailable")

    async def finish_action(self, *_: object, **__: object) -> None:
        raise StoreError("the audit log is unavailable")

    async def record_query(self, **_: object) -> None:
        raise StoreError("the audit log is unavailable")
