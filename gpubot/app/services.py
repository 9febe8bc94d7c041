"""The services beyond status, wired by the composition root (``gpubot.app``): the reset engine,
the sweep with its parts, the approvals and what the chat front ends call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gpubot.app.stores import NoStore
from gpubot.config import Settings
from gpubot.core.ports import AuditStore, Locks, Notifier, Transport
from gpubot.services.status import StatusService

if TYPE_CHECKING:
    from gpubot.chat.flows import Services
    from gpubot.metrics import Metrics
    from gpubot.services.approvals import ApprovalService
    from gpubot.services.reset import ResetService
    from gpubot.services.sweep import SweepService
    from gpubot.slack.api import SlackApi, SlackDirectory
    from gpubot.store import Store


class Root(Protocol):
    """What the wiring reads of the app being built (``gpubot.app.App``)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def transport(self) -> Transport: ...
    @property
    def store(self) -> Store | None: ...
    @property
    def locks(self) -> Locks: ...
    @property
    def status(self) -> StatusService: ...
    @property
    def metrics(self) -> Metrics | None: ...
    @property
    def slack(self) -> SlackApi | None: ...
    @property
    def directory(self) -> SlackDirectory | None: ...


@dataclass(frozen=True)
class Parts:
    """The services beyond status: not built on the cold path."""

    reset: ResetService
    sweep: SweepService
    chat: Services  # what the chat front ends (Slack, console, demo) call
    approvals: ApprovalService | None  # with a store


def wire_parts(app: Root, notifier: Notifier | None) -> Parts:
    """Wire the reset engine, the sweep, the approvals (with a store) and the chat services."""
    from gpubot.app.claims import wire_claims
    from gpubot.chat.alerts import chat_sweeper
    from gpubot.chat.flows import Services
    from gpubot.services.approvals import ApprovalPorts, ApprovalService
    from gpubot.services.directory import NoDirectory
    from gpubot.services.idle_accounting import no_idle_hours
    from gpubot.services.reset import ResetService

    settings, store, status, locks = app.settings, app.store, app.status, app.locks
    audit: AuditStore = store if store is not None else NoStore()
    # With a database, a node's reset and the sweep are exclusive across replicas and processes
    # (leases with fencing tokens, SQLite and PostgreSQL alike); one Locks for both.
    reset = ResetService(settings, app.transport, audit, status, locks, observer=app.metrics)
    sweep = _sweep(app, store, notifier)
    approvals = None
    if store is not None:
        directory = app.directory or NoDirectory()
        ports = ApprovalPorts(store.approvals, reset, status, locks, audit, directory)
        approvals = ApprovalService(settings.policy, ports)
    idle_hours = no_idle_hours if sweep.idle is None else sweep.idle.gpu_hours
    chat = Services(
        settings, settings.policy, status, approvals, store, chat_sweeper(sweep), idle_hours
    )
    chat.posts = None if store is None else store.approval_posts  # the approval outbox
    chat.usage, chat.ladder = sweep.usage, sweep.ladder  # GPU-hours, the reclaim ladder
    wire_claims(settings, store, status, app.metrics, sweep, chat)  # claims and the queue
    return Parts(reset, sweep, chat, approvals)


def _sweep(app: Root, store: Store | None, notifier: Notifier | None) -> SweepService:
    """Wire the sweep: with a store, its audit record, the alert keeper (alert state, the
    notifier, snooze) and the idle accounting (GPU samples)."""
    from gpubot.app.sharing import sharing_ports
    from gpubot.services.alert_keeper import AlertKeeper
    from gpubot.services.health_checks import wire_health
    from gpubot.services.idle_accounting import IdleAccounting
    from gpubot.services.sweep import SweepPorts, SweepService
    from gpubot.services.xid_watch import watch_for

    settings = app.settings
    ecc = None if store is None else store.ecc
    health = wire_health(settings, app.transport, app.status, ecc)  # [sweep] health (issue 27)
    xid = watch_for(settings, app.status, app.metrics)  # [sweep] kernel_log (issue 27)
    ports = SweepPorts(locks=app.locks, observer=app.metrics, health=health, xid=xid)
    if store is not None:
        cfg = settings.sweep
        nodes = [n.name for n in settings.nodes]
        keeper = AlertKeeper(cfg, nodes, store.alerts, notifier)
        idle = IdleAccounting(cfg, settings.reset.protection, store.samples)
        claimed = store.claims  # the claims' rows: GPU-hours claimed but unused
        usage, ladder, digest = sharing_ports(settings, store, app.slack, app.directory, claimed)
        ports = SweepPorts(
            store, keeper, idle, app.locks, app.metrics, health, xid, usage, ladder, digest
        )
    return SweepService(settings, app.status, app.transport, ports)
