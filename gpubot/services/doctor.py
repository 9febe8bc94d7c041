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
from gpubot.core.doctor.node import (
    KERNLOG,
    doctor_argv,
    kernlog_check,
    node_checks,
    parse_facts,
    runtime_argv,
    runtime_check,
)
from gpubot.core.doctor.slurm import (
    DRAIN_RIGHTS,
    drain_rights_check,
    parse_rights,
    restd_check,
    rights_argv,
    scheduler_check,
)
from gpubot.core.doctor.sudo import SudoNeeds
from gpubot.core.health.kernlog import kernlog_argv, parse_kernlog
from gpubot.core.models import NodeConfig
from gpubot.core.ports import Transport
from gpubot.core.slurm import SLURM
from gpubot.core.slurm.read import parse_read, read_argv
from gpubot.errors import (
    AuthRefused,
    CommandTimeout,
    GpubotError,
    HostKeyRejected,
    NodeUnreachable,
    SlurmRestFailed,
    TransportError,
)
from gpubot.services.slurm_read import RestdReader
from gpubot.services.status import fan_out

Fingerprint = Callable[[NodeConfig], Awaitable[str | None]]


@dataclass(frozen=True)
class DoctorParts:
    """What the doctor asks outside the Transport port (None: not configured, not checked)."""

    fingerprint: Fingerprint
    chat: Callable[[Settings], Awaitable[list[Check]]] | None = None  # the platform's own
    database: Callable[[], DbFacts] | None = None
    restd: RestdReader | None = None  # the cluster's slurmrestd, where the settings name one


@dataclass(eq=False)
class DoctorService:
    """Checks nodes, the chat platform and the database; returns the checklist."""

    settings: Settings
    transport: Transport
    parts: DoctorParts

    async def check(self, nodes: Sequence[NodeConfig]) -> list[Check]:
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
        r = self.settings.reset
        needs = SudoNeeds(node.dev_prefix, r.toggle_persistence, node.runtimes, r.stop_workloads)
        checks += node_checks(node, facts, needs)
        if facts.complete:
            checks += await asyncio.gather(*(self._runtime(node, r) for r in node.runtimes))
        if facts.complete and self.settings.sweep.kernel_log:
            checks.append(await self._kernel_log(node))
        if facts.complete and node.scheduler == SLURM:
            checks += await self._slurm(node, facts.sudo)
        return checks

    async def _slurm(self, node: NodeConfig, sudo_list: str | None) -> list[Check]:
        """A Slurm node: its clients answer, the account may drain, slurmrestd answers."""
        name, t = node.slurm_name, self.settings.slurm.timeout_s

        async def clients() -> Check:
            try:
                res = await self.transport.run(node, read_argv(t), timeout=t * 3 + 3)
            except GpubotError as exc:
                return scheduler_check(node.name, str(exc), False, name, "")
            view = parse_read(res.stdout, name, (), 0.0)
            state = "" if view.node is None else "+".join(view.node.states)
            return scheduler_check(node.name, view.error, view.node is not None, name, state)

        async def rights() -> Check:
            try:
                res = await self.transport.run(node, rights_argv(t), timeout=t * 2 + 3)
            except GpubotError as exc:
                return failed(node.name, DRAIN_RIGHTS, str(exc), "fix the node's SSH first")
            return drain_rights_check(node.name, node.sudo, parse_rights(res.stdout), sudo_list)

        checks = list(await asyncio.gather(clients(), rights()))
        if self.parts.restd is not None:
            checks.append(await self._restd(node, name, self.parts.restd))
        return checks

    async def _restd(self, node: NodeConfig, name: str, reader: RestdReader) -> Check:
        s = self.settings.slurm
        try:
            version, error = (await reader.read(name)).version, None
        except SlurmRestFailed as exc:
            version, error = None, str(exc)
        return restd_check(node.name, s.restd_url or "", s.restd_user or "", version, error)

    async def _kernel_log(self, node: NodeConfig) -> Check:
        """Run the sweep's kernel-log read once: which source the account may read."""
        argv = kernlog_argv(None, 60.0)
        try:
            res = await self.transport.run(node, argv, timeout=self.settings.ssh.command_timeout_s)
        except GpubotError as exc:
            return failed(node.name, KERNLOG, str(exc), "fix the node's SSH first")
        return kernlog_check(node.name, node.user, parse_kernlog(res.stdout))

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
        return [] if self.parts.chat is None else await self.parts.chat(self.settings)

    async def database(self) -> list[Check]:
        if self.parts.database is None:
            return []
        return db_checks(await asyncio.to_thread(self.parts.database))
