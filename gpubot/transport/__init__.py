"""Transports to nodes: ``ssh``, ``local`` (NVML) and ``scripted`` (the seam for tests); the only
place that imports asyncssh and pynvml, each mapping its library's errors at one boundary."""

from __future__ import annotations

from collections.abc import Sequence

from gpubot.config import SshSettings
from gpubot.core.models import CommandResult, NodeConfig
from gpubot.core.ports import NvmlTables, Transport
from gpubot.transport import descriptors
from gpubot.transport.local import LocalTransport as LocalTransport
from gpubot.transport.local import nvml_query as nvml_query
from gpubot.transport.scripted import ScriptedTransport as ScriptedTransport
from gpubot.transport.ssh import SshTransport as SshTransport


class RoutingTransport:
    """Sends ``host = "local"`` nodes to a LocalTransport and every other node over SSH."""

    def __init__(self, ssh: SshSettings) -> None:
        self.ssh = SshTransport(ssh)
        self.local = LocalTransport(ssh)

    async def run(
        self, node: NodeConfig, argv: Sequence[str], *, timeout: float | None = None
    ) -> CommandResult:
        t: Transport = self.local if node.host == "local" else self.ssh
        return await t.run(node, argv, timeout=timeout)

    async def nvml_snapshot(self, node: NodeConfig) -> NvmlTables | None:
        """Return NVML's tables for a local node; None for remote nodes or without NVML."""
        return await self.local.nvml_snapshot(node) if node.host == "local" else None

    def connected(self) -> int:
        return self.ssh.connected()

    async def close(self) -> None:
        await self.ssh.close()
        await self.local.close()


def make_transport(ssh: SshSettings, nodes: int = 0) -> RoutingTransport:
    """Return the transport for ``nodes`` nodes: local ones here, the rest over SSH."""
    descriptors.check_fleet(nodes)
    return RoutingTransport(ssh)
