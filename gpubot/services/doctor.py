"""``gpubot doctor``: every node, the chat platform and the database checked at once, each
failing alone.

Each node gets one exec of the doctor script and one bounded lookup per runtime, under the
``[ssh]`` limits. What the Transport port cannot ask (a host key's fingerprint, the chat
platform's facts, the database's) arrives as callables from the entry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from gpubot.config import Settings
from gpubot.core.doctor.checks import Check, failed, passed
from gpubot.core.doctor.facts import DbFacts, db_checks
from gpubot.core.doctor.kernlog import kernlog_check
from gpubot.core.doctor.node import (
    doctor_argv,
    node_checks,
    parse_facts,
    runtime_argv,
    runtime_check,
)
from gpubot.core.doctor.sudo import SudoNeeds
from gpubot.core.health.kernlog import kernlog_argv, parse_kernlog
from gpubot.core.models import NodeConfig
from gpubot.core.ports import Transport
from gpubot.errors import (
    AuthRefused,
    CommandTimeout,
    GpubotError,
    HostKeyRejected,
    NodeUnreachable,
    TransportError,
)
from gpubot.services.status import fan_out

Fingerprint = Callable[[NodeConfig], Awaitable[str | None]]


@dataclass(frozen=True)
class DoctorParts:
    """What the doctor asks outside the Transport port (None: not configured, not checked)."""

    fingerprint: Fingerprint
    chat: Callable[[Settings], Awaitable[list[Check]]] | None = None  # the platform's own
    database: Callable[[], DbFacts] | None = None


class DoctorService:
    """Checks nodes, the chat platform and the database; returns the checklist."""

    def __init__(self, settings: Settings, transport: Transport, parts: DoctorParts) -> None:
        self.settings = settings
        self.transport = transport
        self.parts = parts

    async def check(self, nodes: Sequence[NodeConfig]) -> list[Check]:
        """Return the checks of ``nodes``, then the chat platform's and the database's."""
        chat = asyncio.ensure_future(self.chat())
        database = asyncio.ensure_future(self.database())
        res = await fan_out(nodes, self.node, self.settings.ssh.max_parallel)
        out: list[Check] = []
        for n in nodes:
            if n.name in res.ok:
                out += res.ok[n.name]
            else:
                why = str(res.failed[n.name])
                fix = f"`gpubot status {n.name}` meets the same failure: fix it there first"
                out.append(failed(n.name, "checked", why, fix))
        return out + await chat + await database

    async def node(self, node: NodeConfig) -> list[Check]:
        """Return one node's checks: reachable, host key, auth, then what its script found."""
        ssh = self.settings.ssh
        argv = doctor_argv(node, timeout_s=max(1.0, ssh.command_timeout_s - 2))
        try:
            result = await self.transport.run(node, argv, timeout=ssh.command_timeout_s)
        except TransportError as exc:
            return await self._transport_failed(node, exc)
        checks = [
            passed(node.name, "reachable", f"{node.host}:{node.port}"),
            passed(node.name, "host key", "pinned and matching"),
            passed(node.name, "auth", node.user or "(the current user)"),
        ]
        if node.host == "local":  # read here, with no SSH: nothing to pin or log in to
            checks = [passed(node.name, "reachable", "the local box (no SSH)")]
        facts = parse_facts(result.stdout)
        checks += node_checks(node, facts, self._needs(node))
        if facts.complete:
            checks += await asyncio.gather(*(self._runtime(node, r) for r in node.runtimes))
        if facts.complete and self.settings.sweep.kernel_log:
            checks.append(await self._kernel_log(node))
        return checks

    async def _kernel_log(self, node: NodeConfig) -> Check:
        """Run the sweep's kernel-log read once: which source the account may read."""
        argv = kernlog_argv(None, 60.0)
        try:
            res = await self.transport.run(node, argv, timeout=self.settings.ssh.command_timeout_s)
        except GpubotError as exc:
            return failed(node.name, "kernel log (Xid)", str(exc), "fix the node's SSH first")
        return kernlog_check(node.name, node.user, parse_kernlog(res.stdout))

    def _needs(self, node: NodeConfig) -> SudoNeeds:
        r = self.settings.reset
        return SudoNeeds(node.dev_prefix, r.toggle_persistence, node.runtimes, r.stop_workloads)

    async def _transport_failed(self, node: NodeConfig, exc: TransportError) -> list[Check]:
        area, where = node.name, f"{node.host}:{node.port}"
        if isinstance(exc, NodeUnreachable | CommandTimeout):
            fix = f"check that {where} runs sshd and that this host may reach it"
            return [failed(area, "reachable", exc.reason, fix)]
        reach = passed(area, "reachable", where)
        if isinstance(exc, HostKeyRejected):
            return [reach, await self._host_key(node, exc)]
        if isinstance(exc, AuthRefused):
            user = node.user or "gpubot's account"
            fix = f"put the .pub of {node.key or 'gpubot key'} in ~{user}/.ssh/authorized_keys"
            return [
                reach,
                passed(area, "host key", "pinned"),
                failed(area, "auth", exc.reason, fix),
            ]
        return [reach, failed(area, "connection", exc.reason, "check the node's SSH server")]

    async def _host_key(self, node: NodeConfig, exc: HostKeyRejected) -> Check:
        known = self.settings.ssh.known_hosts
        if "cannot read known_hosts" in exc.reason:
            return failed(node.name, "host key", exc.reason, f"create {known} (ssh-keyscan)")
        shown = await self.parts.fingerprint(node)
        seen = f"it presents {shown}" if shown else "its key could not be read"
        scan = f"ssh-keyscan -p {node.port} {node.host} >> {known}"
        if "CHANGED" in exc.reason:
            what = f"CHANGED: not the key pinned in {known}; {seen}"
            fix = (
                f"if the box was reinstalled, check that fingerprint on its console, then "
                f"ssh-keygen -R '[{node.host}]:{node.port}' -f {known} && {scan}"
            )
        else:
            what = f"unknown: not in {known}; {seen}"
            fix = f"check that fingerprint on the box's console (ssh-keygen -lf), then {scan}"
        return failed(node.name, "host key", what, fix)

    async def _runtime(self, node: NodeConfig, runtime: str) -> Check:
        limit = self.settings.attribution.lookup_timeout_s
        try:
            argv = runtime_argv(runtime, timeout_s=limit, sudo=node.sudo)
        except ValueError as exc:
            return passed(node.name, f"runtime {runtime}", f"not checked: {exc}")
        try:
            res = await self.transport.run(node, argv, timeout=limit + 3)
        except GpubotError as exc:
            status = 124 if isinstance(exc, TimeoutError) else 255
            return runtime_check(node.name, runtime, status, str(exc))
        return runtime_check(node.name, runtime, res.exit_status, res.stderr + res.stdout)

    async def chat(self) -> list[Check]:
        """Return the chat platform's checks of itself (its front end says what it skips)."""
        return [] if self.parts.chat is None else await self.parts.chat(self.settings)

    async def database(self) -> list[Check]:
        """Return the database checks."""
        if self.parts.database is None:
            return []
        return db_checks(await asyncio.to_thread(self.parts.database))
