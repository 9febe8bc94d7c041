"""The services, built complete and in dependency order (each before what it decorates, seals
or feeds), then the chosen front end's flows. Not built on the cold path (``gpubot status``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING

from gpubot.app.front import FrontEnd, Publisher
from gpubot.app.stores import NoStore
from gpubot.chat.alerts import chat_sweeper
from gpubot.chat.approval_words import ApprovalWords
from gpubot.chat.dm_route import DmRoute
from gpubot.chat.flows import Flows, Services
from gpubot.chat.heads import HeadPublisher
from gpubot.chat.ladder import LadderTeller
from gpubot.chat.message import Message
from gpubot.chat.report_view import ChannelDigest
from gpubot.config import Settings
from gpubot.config.front_ends import has_forms, reaches
from gpubot.core.ports import Locks, PromSource, Transport
from gpubot.core.slurm import SLURM
from gpubot.lifecycle import SweepHeap
from gpubot.services.alert_keeper import AlertKeeper
from gpubot.services.approval_duty import ApprovalDuty
from gpubot.services.approvals import ApprovalPorts, ApprovalService
from gpubot.services.claims import ClaimService
from gpubot.services.digest import DigestService
from gpubot.services.directory import Directory, NoDirectory
from gpubot.services.health_checks import wire_health
from gpubot.services.idle_accounting import IdleAccounting
from gpubot.services.ladder import ReclaimLadder
from gpubot.services.maint import MaintService
from gpubot.services.outbox import Outbox
from gpubot.services.requests import RequestService
from gpubot.services.reset import ResetService
from gpubot.services.seals import SealService
from gpubot.services.slurm_read import RestdReader
from gpubot.services.slurm_watch import SlurmWatch
from gpubot.services.status import Sources, StatusService
from gpubot.services.sweep import ExtraFindings, SweepPorts, SweepService
from gpubot.services.usage import UsageService
from gpubot.services.xid_watch import watch_for
from gpubot.store import Store

if TYPE_CHECKING:  # prometheus_client only where a gpubot serves (``root.build``)
    from gpubot.metrics import Metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Base:
    """What every service is built over (``root.build`` makes it first)."""

    settings: Settings
    transport: Transport
    store: Store | None
    locks: Locks
    metrics: Metrics | None = None  # a serving gpubot's
    heap: SweepHeap | None = None  # the collector around sweeps and rounds (``lifecycle``)
    serving: bool = False  # a long-running gpubot: its audit head is published
    restd: RestdReader | None = None  # the cluster's slurmrestd, read (``app.sources``)
    prom: PromSource | None = None  # the site's Prometheus: summaries, and sweeps' candidates


@dataclass(frozen=True)
class Parts:
    """The services of a gpubot that is not the cold ``gpubot status``."""

    status: StatusService
    reset: ResetService
    sweep: SweepService
    chat: Services  # what the chat front ends (Slack, console, demo) call
    approvals: ApprovalService | None  # with a store
    seals: SealService | None  # with a store and its key
    heads: Publisher | None  # a serving gpubot's, with a store and a front end that posts it
    flows: Flows | None  # the front end's, when there is one
    dms: DmRoute | None = None  # the front end's DMs, and those handed over to it


def build_parts(base: Base, front: FrontEnd | None) -> Parts:
    """Build every service over ``base``, ``front``'s outlets wired in."""
    settings, store, metrics = base.settings, base.store, base.metrics
    health = wire_health(settings, base.transport, None if store is None else store.ecc)
    xid = watch_for(settings, base.transport, None if metrics is None else metrics.count_xid)
    heap = None if base.heap is None else base.heap.around
    # Statuses show the health and the Xids that each node's last sweep read, and the windows.
    shown = [*([] if health is None else [health.decorate]), *([] if xid is None else [xid.flag])]
    status = StatusService(
        settings, base.transport, store, decorators=shown, heap=heap, sources=_sources(base)
    )
    # The one outbox: the store's records, posted through the front end's ``Poster``.
    outbox: Outbox[Message] = Outbox(
        None if store is None else store.outbox, None if front is None else front.poster()
    )
    heads = _heads(base, outbox)
    seals = _seals(settings, store, heads)
    audit = store if store is not None else NoStore()
    reset = ResetService(
        settings,
        base.transport,
        audit,
        status,
        base.locks,
        metrics,
        after_forced=None if seals is None else seals.forced,
    )
    claims = None
    if store is not None:
        observe = None if metrics is None else metrics.observe_claims  # gpubot_gpu_claimed
        claims = ClaimService(settings, store.claims, status, observe=observe, maint=store.maint)
    directory = None if front is None else front.directory()
    ports = SweepPorts(locks=base.locks, observer=metrics, health=health, xid=xid, heap=heap)
    dms = None if front is None else _dms(front, outbox, store)
    sweep = _sweep(base, status, ports, claims, front, directory, outbox, dms)
    approvals, maint = None, None
    if store is not None:
        asks = ApprovalPorts(store.approvals, reset, audit, directory or NoDirectory())
        approvals = ApprovalService(settings.policy, asks)
        maint = MaintService(store.maint, status, approvals.is_approver)
    chat = Services(
        settings,
        settings.policy,
        status,
        approvals,
        store,
        RequestService(approvals),
        chat_sweeper(sweep),
        None if sweep.idle is None else sweep.idle.gpu_hours,  # None: nothing known idle
        duty=_duty(settings, approvals, outbox, front),
        usage=sweep.usage,
        ladder=sweep.ladder,
        claims=claims,
        maint=maint,
    )
    flows = None
    if front is not None and dms is not None:
        flows = Flows(chat, source=front.name, min_update_s=front.min_update_s, dm=dms)
    return Parts(status, reset, sweep, chat, approvals, seals, heads, flows, dms)


def _dms(front: FrontEnd, outbox: Outbox[Message], store: Store | None) -> DmRoute:
    """A DM to a person this front end reaches goes through it; one to another front end's
    person is handed over through the store (``chat.dm_route``)."""
    due = None if store is None else store.dm_due
    takes = has_forms(front.name)  # the console reaches anyone: it takes no one else's DMs
    return DmRoute(front.dm(outbox), partial(reaches, front.name), due, takes=takes)


def _sources(base: Base) -> Sources:
    """What a status reads beside the nodes: slurmrestd, the site's Prometheus (the summary of
    nodes whose telemetry is "prometheus", in chat as in the CLI, and the sweeps' candidates),
    and the store's maintenance windows."""
    return Sources(base.restd, base.prom, None if base.store is None else base.store.maint)


def _duty(
    settings: Settings,
    approvals: ApprovalService | None,
    outbox: Outbox[Message],
    front: FrontEnd | None,
) -> ApprovalDuty[Message] | None:
    """With a store and a front end that posts once: the approval duty (re-pings, tells)."""
    if approvals is None or front is None or outbox.store is None or outbox.poster is None:
        return None
    words = ApprovalWords(settings.policy.expiry_s)
    ttl = settings.leases.ttl_s  # a dead holder's lease lapses no sooner
    return ApprovalDuty(approvals, outbox, words, front=front.name, settled_s=ttl)


def _heads(base: Base, outbox: Outbox[Message]) -> HeadPublisher | None:
    """A serving gpubot's audit head publisher, posting in the alerts' channel or room, with a
    store and a front end that posts once (None: none, or not asked for)."""
    settings, store = base.settings, base.store
    if not (base.serving and outbox.poster and store and settings.audit.publish_head_every_s):
        return None
    channel = settings.sweep.channel
    if channel is None:
        log.warning("no alerts channel or room: the audit head is not published")
        return None
    return HeadPublisher(store, outbox, channel)


def _seals(settings: Settings, store: Store | None, heads: Publisher | None) -> SealService | None:
    """With a store and its key: the audit log's seals. A forced reset is sealed at its end and
    the head then published at once."""
    every = settings.audit.seal_every_s
    if every is None or store is None or store.audit_key is None:
        return None
    return SealService(store, every, after_forced=() if heads is None else (heads.publish,))


def _sweep(
    base: Base,
    status: StatusService,
    ports: SweepPorts,
    claims: ClaimService | None,
    front: FrontEnd | None,
    directory: Directory | None,
    outbox: Outbox[Message],
    dms: DmRoute | None,
) -> SweepService:
    """The sweep over ``ports``; with a store also everything a sweep feeds."""
    settings, store = base.settings, base.store
    if store is not None:
        cfg, reports = settings.sweep, settings.reports
        notifier = None if front is None or dms is None else front.alerts(settings, outbox, dms)
        usage = UsageService(
            settings,
            store.usage,
            claims=store.claims,
            directory=directory,
            transport=base.transport,
        )
        told = None
        if dms is not None and outbox.poster is not None:  # a front end that posts once
            people = settings.policy.chat_ids()
            told = LadderTeller(dms, cfg.channel, people, outbox)
        digest, channel = None, reports.digest_channel or cfg.channel
        if reports.digest is not None and outbox.poster is not None and channel is not None:
            post = ChannelDigest(outbox, channel)
            digest = DigestService(reports.digest, reports.digest_by, usage, outbox, post)
        ports = replace(
            ports,
            audit=store,
            keeper=AlertKeeper(
                cfg,
                [n.name for n in settings.nodes],
                store.alerts,
                notifier,
                outbox,
                slurm_nodes=[n.name for n in settings.nodes if n.scheduler == SLURM],
                maint=store.maint,
            ),
            idle=IdleAccounting(cfg, settings.reset.protection, store.samples),
            usage=usage,
            ladder=ReclaimLadder(settings.ladder, store.ladder, store.samples, told),
            digest=digest,
        )
    ports = replace(ports, extra=extra_findings(settings, claims))
    return SweepService(settings, status, base.transport, ports)


def extra_findings(settings: Settings, claims: ClaimService | None) -> tuple[ExtraFindings, ...]:
    """Return the sweep's further findings: claims' unclaimed use, and Slurm's where a node has
    it (the latter need no store)."""
    out: list[ExtraFindings] = [] if claims is None else [claims.intruder_findings]
    if any(n.scheduler == SLURM for n in settings.nodes):
        out.append(SlurmWatch(settings.slurm).findings)
    return tuple(out)
