"""The host key a node presents, for ``gpubot doctor`` to print when it is unknown or changed.

Read with a connection that authenticates nothing and runs nothing (``get_server_host_key``
stops after the key exchange): a fingerprint to check against the box's console, never trust.
"""

from __future__ import annotations

from gpubot.core.clock import within
from gpubot.core.models import NodeConfig
from gpubot.transport.sshlib import asyncssh


async def presented_fingerprint(node: NodeConfig, timeout_s: float) -> str | None:
    """Return the SHA256 fingerprint of ``node``'s host key, or None when it cannot be read."""
    try:
        key = await within(
            asyncssh.get_server_host_key(node.host, node.port, config=None), timeout_s
        )
    except (asyncssh.Error, OSError, TimeoutError):
        return None
    return None if key is None else f"{key.get_algorithm()} {key.get_fingerprint()}"
