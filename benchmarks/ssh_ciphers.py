"""The SSH client's CPU per warm exec, by cipher: asyncssh's default order beside gpubot's.

::

    python -m benchmarks.ssh_ciphers                 # 64 nodes, 3 rounds of 10 execs a node
    python -m benchmarks.ssh_ciphers --smoke         # tiny: keeps it working

One server process (asyncssh, ``--nodes`` ports on 127.0.0.1) answers every exec with one real
probe answer of a simulated 8-GPU node (``benchmarks.scale_store.recorded_probe``), so the
client's side is what is measured. Four arms, alternating round after round in this process over
connections opened beforehand: ``floor`` (a minimal asyncssh ``conn.run`` of the probe's
command) and ``gpubot``
(``SshTransport.run``, the probe's argv), each with asyncssh's default cipher order
(chacha20-poly1305 first) and with gpubot's (``transport.ssh.CIPHERS``: AES-GCM first). The
figure is this process's CPU (``time.process_time``) per exec, the execs of a round run
``--parallel`` at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from benchmarks.common import table
from gpubot.transport.ssh import CIPHERS as _GCM  # gpubot's order, the same string
from gpubot.transport.sshlib import asyncssh

ARMS = ("floor:default", "floor:gcm", "gpubot:default", "gpubot:gcm")


class _AnyKey(asyncssh.SSHServer):
    def begin_auth(self, username: str) -> bool:
        return True

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        return True  # 127.0.0.1, a benchmark's own fleet


async def serve(work: Path, nodes: int) -> None:
    """Serve ``nodes`` ports answering every exec with ``work/answer`` (the sweep's health exec,
    which names itself ``gpubot-health``, with ``work/health``), each port ``node{i}``'s own
    (``scale_store.own_answer``: its processes' cgroups); write their ports."""
    from benchmarks.scale_store import own_answer

    answer, health = (work / "answer").read_text(), (work / "health").read_bytes()

    def handler(own: bytes) -> Callable[[asyncssh.SSHServerProcess[bytes]], None]:
        def handle(proc: asyncssh.SSHServerProcess[bytes]) -> None:
            proc.stdout.write(health if "gpubot-health" in (proc.command or "") else own)
            proc.exit(0)

        return handle

    key = asyncssh.read_private_key(str(work / "host_key"))
    servers = [
        await asyncssh.create_server(
            _AnyKey,
            "127.0.0.1",
            0,
            server_host_keys=[key],
            process_factory=handler(own_answer(answer, f"node{i}").encode()),
            encoding=None,
        )
        for i in range(1, nodes + 1)
    ]
    ports = [s.sockets[0].getsockname()[1] for s in servers]
    (work / "ports.json").write_text(json.dumps(ports))
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


async def _arms(
    work: Path, ports: list[int], rounds: int, execs: int, parallel: int, recorded: Any
) -> Any:
    from gpubot.config import SshSettings
    from gpubot.core.models import NodeConfig
    from gpubot.core.probe.snapshot import probe_argv
    from gpubot.transport import ssh

    key = str(work / "client_key")
    nodes = [NodeConfig(f"node{i}", "127.0.0.1", port=p, key=key) for i, p in enumerate(ports, 1)]
    settings = SshSettings(known_hosts=str(work / "known_hosts"), connect_timeout_s=30)
    argv = probe_argv(nodes[0], smi_timeout_s=18.0)
    command = shlex.join(argv)  # the floor sends the same command
    gate = asyncio.Semaphore(parallel)
    out: dict[str, list[float]] = {a: [] for a in ARMS}
    for _ in range(rounds):
        for arm in ARMS:
            kind, cipher = arm.split(":")
            ssh.CIPHERS = "default" if cipher == "default" else _GCM
            if kind == "floor":
                conns = [await _floor_conn(work, n, cipher) for n in nodes]

                async def one(i: int, via: Any = conns) -> None:
                    async with gate:
                        await via[i].run(command, encoding=None, check=True)

                close = [c.close for c in conns]
            else:
                transport = ssh.SshTransport(settings)

                async def one(i: int, via: Any = transport) -> None:
                    async with gate:
                        await via.run(nodes[i], argv)

                close = []
            await asyncio.gather(*(one(i) for i in range(len(nodes))))  # connect, warm
            c0 = time.process_time()
            for _ in range(execs):
                await asyncio.gather(*(one(i) for i in range(len(nodes))))
            out[arm].append((time.process_time() - c0) / (execs * len(nodes)) * 1000)
            for f in close:
                f()
            if kind == "gpubot":
                await transport.close()
    return out


async def _floor_conn(work: Path, node: Any, cipher: str) -> Any:
    return await asyncssh.connect(
        node.host,
        node.port,
        known_hosts=str(work / "known_hosts"),
        client_keys=[str(work / "client_key")],
        agent_path=None,
        config=None,
        encryption_algs="default" if cipher == "default" else _GCM,
    )


Arms = Callable[[Path, list[int], int, int, int, Any], Coroutine[Any, Any, Any]]


def run(
    nodes: int, rounds: int, execs: int, parallel: int, arms: Arms | None = None
) -> dict[str, Any]:
    """Start the server, run the arms (``_arms``: the ciphers'), return the figures. ``arms``
    gets the work folder (keys, ``known_hosts``), the ports, the three counts and the recorded
    node (``benchmarks.scale_store.recorded_probe``: its settings and answers)."""
    from benchmarks.scale_store import recorded_probe

    with tempfile.TemporaryDirectory(prefix="gpubot-ciphers-") as tmp:
        work = Path(tmp)
        recorded = recorded_probe(work)
        answers = recorded[1]
        (work / "answer").write_text(answers.probe.stdout)
        (work / "health").write_text(answers.health.stdout)
        host = asyncssh.generate_private_key("ssh-ed25519")
        host.write_private_key(str(work / "host_key"))
        asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(work / "client_key"))
        args = [sys.executable, "-m", "benchmarks.ssh_ciphers", "serve", str(work), str(nodes)]
        server = subprocess.Popen(args, stdin=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 120
            while not (work / "ports.json").exists():
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("the benchmark's SSH server did not start")
                time.sleep(0.1)
            ports = json.loads((work / "ports.json").read_text())
            pub = host.export_public_key().decode().strip()
            (work / "known_hosts").write_text("".join(f"[127.0.0.1]:{p} {pub}\n" for p in ports))
            measure = arms or _arms
            figures: Any = asyncio.run(measure(work, ports, rounds, execs, parallel, recorded))
        finally:
            assert server.stdin is not None
            server.stdin.close()
            server.wait(30)
    return {
        "nodes": nodes,
        "rounds": rounds,
        "execs": execs,
        "bytes": len(answers.probe.stdout),
        "arms": figures,
    }


def report(res: dict[str, Any]) -> str:
    """Return the figures as a Markdown table and the ratios."""
    arms = res["arms"]
    med = {a: statistics.median(v) for a, v in arms.items()}
    rows = [[a, " / ".join(f"{x:.3f}" for x in arms[a]), f"{med[a]:.3f}"] for a in ARMS]
    head = ["arm", "client CPU ms per exec (each round)", "median"]
    lines = [
        f"{res['nodes']} nodes, {res['execs']} execs a node a round, {res['rounds']} rounds, "
        f"answers of {res['bytes']:,} bytes",
        "",
        table(head, rows),
        "",
        f"- floor: gcm / default = {med['floor:gcm'] / med['floor:default']:.2f}x",
        f"- gpubot's transport: gcm / default = {med['gpubot:gcm'] / med['gpubot:default']:.2f}x",
        f"- gpubot's transport over the floor, both gcm: "
        f"{med['gpubot:gcm'] - med['floor:gcm']:+.3f} ms per exec",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["serve"]:
        asyncio.run(serve(Path(argv[1]), int(argv[2])))
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.ssh_ciphers")
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--execs", type=int, default=10, help="execs a node in each round")
    p.add_argument("--parallel", type=int, default=64)
    p.add_argument("--smoke", action="store_true", help="tiny sizes")
    a = p.parse_args(argv)
    if a.smoke:
        a.nodes, a.rounds, a.execs = 4, 1, 2
    print(report(run(a.nodes, a.rounds, a.execs, a.parallel)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
