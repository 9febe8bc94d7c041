"""The two processes of the descriptor test: SSH servers for a large fleet, and a bot under a
descriptor limit.

``python -m tests.integration.fd_fleet server HOST_KEY PORTS_FILE K``: K asyncssh servers on
127.0.0.1 (any client key; every command prints ``ok``), their ports written to PORTS_FILE; they
serve until stdin closes. Its own descriptor limit is raised to the hard one.

``python -m tests.integration.fd_fleet client SPEC_JSON``: sets ``RLIMIT_NOFILE`` to the spec's
soft and hard limits first, then runs ``true`` on every node through gpubot's SSH transport
(bounded fan-out, each node failing alone), logging to stderr, and prints one JSON line: how
many nodes answered and the failures by reason.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from gpubot.transport.sshlib import asyncssh


class _Server(asyncssh.SSHServer):
    def begin_auth(self, username: str) -> bool:
        return True

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        return True  # a test fleet on 127.0.0.1: any key


async def _answer(process: asyncssh.SSHServerProcess[str]) -> None:
    process.stdout.write("ok\n")
    process.exit(0)


async def serve(host_key: str, ports_file: str, k: int) -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    servers = [
        await asyncssh.create_server(
            _Server,
            "127.0.0.1",
            0,
            server_host_keys=[host_key],
            process_factory=_answer,
            backlog=1024,
        )
        for _ in range(k)
    ]
    ports = [s.sockets[0].getsockname()[1] for s in servers]
    Path(ports_file).write_text(json.dumps(ports))
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for s in servers:
        s.close()


async def client(spec: dict[str, Any]) -> dict[str, Any]:
    from gpubot.config import SshSettings
    from gpubot.core.models import NodeConfig
    from gpubot.services.status import fan_out, reason
    from gpubot.transport import descriptors
    from gpubot.transport.ssh import SshTransport

    if spec.get("raise"):
        descriptors.raise_soft_limit()
    ports = spec["ports"]
    nodes = [
        NodeConfig(
            name=f"n{i}",
            host="127.0.0.1",
            port=ports[i % len(ports)],
            user="gpubot",
            key=spec["key"],
        )
        for i in range(spec["nodes"])
    ]
    descriptors.check_fleet(len(nodes))
    ssh = SshSettings(known_hosts=spec["known_hosts"], connect_timeout_s=30, command_timeout_s=60)
    transport = SshTransport(ssh, max_connections=spec.get("cap"))
    try:
        res = await fan_out(nodes, lambda n: transport.run(n, ["true"]), 64)
    finally:
        await transport.close()
    bad = [n for n, r in res.ok.items() if r.stdout != "ok\n"]
    why = Counter(reason(e, n) for n, e in res.failed.items())
    return {"ok": len(res.ok) - len(bad), "failed": dict(why.most_common(3)), "bad": len(bad)}


def main(argv: list[str]) -> int:
    if argv[:1] == ["server"] and len(argv) == 4:
        asyncio.run(serve(argv[1], argv[2], int(argv[3])))
        return 0
    if argv[:1] == ["client"] and len(argv) == 2:
        spec = json.loads(argv[1])
        resource.setrlimit(resource.RLIMIT_NOFILE, (spec["soft"], spec["hard"]))
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
        logging.getLogger("asyncssh").setLevel(logging.ERROR)
        print(json.dumps(asyncio.run(client(spec))))
        return 0
    print("usage: fd_fleet server HOST_KEY PORTS_FILE K | client SPEC_JSON", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
