"""The sweep's GPU health checks: one bounded exec per node, after its probe.

Only a sweep asks, and only a node whose probe answered (a hung nvidia-smi is not asked again);
one that fails leaves that node's health unknown, noted, never the node failed. The field set a
node's driver accepted is asked first next time. What earlier sweeps saw is advanced by alerting
sweeps only, so a sweep by hand never makes throttling look sustained. Statuses show each node's
last read without asking it. The parsing and findings run off the loop, which they held too long.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import replace

from gpubot.config import Settings
from gpubot.core.findings import Finding
from gpubot.core.health.findings import EccKey, EccSeen, HealthMemory, find_health
from gpubot.core.health.hung import HungRule
from gpubot.core.health.nvlink import expect_links
from gpubot.core.health.state import FIELD_SETS, NodeHealth, health_argv, parse_health
from gpubot.core.health.vanished import VanishedMemory, find_vanished
from gpubot.core.models import NodeConfig, NodeSnapshot
from gpubot.core.ports import EccStore, Transport
from gpubot.errors import DUTY_TURN, GpubotError, StoreError
from gpubot.services.offload import off_loop
from gpubot.services.status import reason

log = logging.getLogger(__name__)


def with_health(snap: NodeSnapshot, health: NodeHealth) -> NodeSnapshot:
    """Return ``snap`` with each GPU's health fields (and the fabric manager, in a fabric)."""
    fm = health.fabric_manager if health.in_fabric else None
    gpus = tuple(
        replace(g, health=h if h.fabric_manager == fm else replace(h, fabric_manager=fm))
        if (h := health.gpus.get(g.index)) is not None
        else g
        for g in snap.gpus
    )
    return replace(snap, gpus=gpus, notes=snap.notes + health.notes)


class HealthChecks:
    """Reads the nodes' health for the sweep and turns it into findings."""

    def __init__(
        self,
        transport: Transport,
        *,
        timeout_s: float = 10.0,
        store: EccStore | None = None,
        gpus: Mapping[str, int] | None = None,
        hung: HungRule | None = None,
    ) -> None:
        """``timeout_s``: the whole exec's limit; ``store`` keeps the ECC counts across restarts;
        ``gpus``: how many GPUs each node has where its settings say (``gpu-vanished``);
        ``hung``: the hung-but-busy rule (None: not looked for). Its runs and learned draws are
        kept in memory only: a restart counts a run again from its next look (a finding later,
        never one more)."""
        self.transport = transport
        self.gpus = dict(gpus or {})
        self.vanished = VanishedMemory()
        self.hung = hung
        self.timeout_s = timeout_s
        self.store = store
        self.memory = HealthMemory()
        self._loaded = store is None  # the store's counts are read once, at the first sweep
        self.last: dict[str, NodeHealth] = {}  # each node's latest health, for statuses
        self._sets: dict[str, str] = {}  # the field set each node's driver accepted

    async def read(self, node: NodeConfig, *, within_s: float | None = None) -> NodeHealth:
        """Ask one node within ``within_s``; what it does not say in time stays unknown."""
        limit = self.timeout_s if within_s is None else min(self.timeout_s, within_s)
        if limit < 1.0:
            return parse_health(None, why_unknown="no time left in the sweep budget")
        first = self._sets.get(node.name)
        names = list(FIELD_SETS)
        sets = names if first is None else [first, *(n for n in names if n != first)]
        argv = health_argv(
            node.nvidia_smi,
            max(0.5, (limit - 1.0) / 3),
            sets=sets,
            fm_pid=node.fabricmanager_pid,
            pci_dir=node.pci_dir,
        )
        try:
            res = await self.transport.run(node, argv, timeout=limit)
        except GpubotError as exc:
            return parse_health(None, why_unknown=reason(exc, node.name))
        health = await off_loop(parse_health, res.stdout)
        if health.field_set is not None:
            self._sets[node.name] = health.field_set
        return health

    async def attach(
        self, node: NodeConfig, snap: NodeSnapshot, *, within_s: float | None = None
    ) -> NodeSnapshot:
        health = await self.read(node, within_s=within_s)
        # the links each GPU should have up, as alerting sweeps learned them (tables show it)
        health = await off_loop(expect_links, node.name, snap.gpus, health, self.memory.links)
        self.last[node.name] = health
        return await off_loop(with_health, snap, health)

    def decorate(self, snap: NodeSnapshot) -> NodeSnapshot:
        """Return a status's ``snap`` with the health its node's last sweep read, if any."""
        health = self.last.get(snap.node)
        return snap if health is None else with_health(snap, replace(health, notes=()))

    async def findings(
        self, snaps: Iterable[NodeSnapshot], *, advance: bool, at: float | None = None
    ) -> tuple[Finding, ...]:
        """Return the health findings of a sweep's snapshots (``advance``: remember them;
        ``at``: the sweep's time, None: each snapshot's)."""
        await self._load()
        snaps = list(snaps)
        found, memory, changed = await off_loop(_find, snaps, self.memory, self.hung, at)
        pci = {n: h.pci for n, h in self.last.items()}
        gone, vanished = await off_loop(find_vanished, snaps, pci, self.gpus, self.vanished)
        found += gone
        if advance:
            self.memory = memory
            self.vanished = vanished
            if self.store is not None and changed:
                try:
                    await self.store.put_ecc(changed)
                except StoreError as exc:
                    log.warning("ECC counts not stored (kept in memory): %s", exc, extra=DUTY_TURN)
        return found

    async def _load(self) -> None:
        if self._loaded or self.store is None:
            return
        try:
            self.memory.ecc.update(await self.store.ecc_counts())
            self._loaded = True
        except StoreError as exc:  # tried again next sweep; until then, memory only
            log.warning("ECC counts not read: %s", exc, extra=DUTY_TURN)


def wire_health(
    settings: Settings, transport: Transport, store: EccStore | None = None
) -> HealthChecks | None:
    """Return the sweep's health checks (None with ``[sweep] health = false``); their
    ``decorate`` shows in a status the health each node's last sweep read."""
    if not settings.sweep.health:
        return None
    gpus = {n.name: n.gpus for n in settings.nodes if n.gpus is not None}
    sweep = settings.sweep
    hung = HungRule(sweep.hung_sweeps, max_gap_s=sweep.max_gap_s) if sweep.hung_sweeps else None
    return HealthChecks(
        transport, timeout_s=settings.ssh.command_timeout_s, store=store, gpus=gpus, hung=hung
    )


def _find(
    snaps: list[NodeSnapshot],
    memory: HealthMemory,
    hung: HungRule | None = None,
    at: float | None = None,
) -> tuple[tuple[Finding, ...], HealthMemory, dict[EccKey, EccSeen]]:
    """Return the findings, the memory after them and the ECC counts that changed."""
    found, after = find_health(snaps, _from_snapshots(snaps), memory, hung=hung, at=at)
    changed = {k: v for k, v in after.ecc.items() if memory.ecc.get(k) != v}
    return found, after, changed


def _from_snapshots(snaps: Iterable[NodeSnapshot]) -> Mapping[str, NodeHealth]:
    out: dict[str, NodeHealth] = {}
    for s in snaps:
        gpus = {g.index: g.health for g in s.gpus if g.health is not None}
        if gpus:
            fm = next((h.fabric_manager for h in gpus.values() if h.fabric_manager), "unknown")
            out[s.node] = NodeHealth(gpus, None, fm)
    return out
