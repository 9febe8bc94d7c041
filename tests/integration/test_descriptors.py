"""1,500 nodes under a descriptor limit of 1,024 (issue 24): every node answers, and the bot says
in one line why it closes connections; the control, without the pool's cap, loses nodes to
``EMFILE``. The fleet is three asyncssh servers on 127.0.0.1 in another process (every node a
name of its own, so one connection each); the bot is a process of its own whose limit is set
with ``setrlimit`` before anything else (``fd_fleet``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpubot.transport.sshlib import asyncssh

NODES = 1500


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("fd-fleet")
    host = asyncssh.generate_private_key("ssh-ed25519")
    host.write_private_key(str(d / "host"))
    user = asyncssh.generate_private_key("ssh-ed25519")
    user.write_private_key(str(d / "user"))
    d.joinpath("user").chmod(0o600)
    ports_file = d / "ports.json"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.integration.fd_fleet",
            "server",
            str(d / "host"),
            str(ports_file),
            "3",
        ],
        stdin=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while not ports_file.exists() or not ports_file.read_text():
            assert server.poll() is None and time.monotonic() < deadline, "servers did not start"
            time.sleep(0.05)
        ports = json.loads(ports_file.read_text())
        line = host.export_public_key().decode().strip()
        known = d / "known_hosts"
        known.write_text("".join(f"[127.0.0.1]:{p} {line}\n" for p in ports))
        yield {"ports": ports, "key": str(d / "user"), "known_hosts": str(known)}
    finally:
        assert server.stdin is not None
        server.stdin.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def bot(fleet: dict[str, Any], **spec: Any) -> tuple[dict[str, Any], list[str]]:
    """Run the bot's side under ``spec``'s limits; return its answer and its log lines."""
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.integration.fd_fleet",
            "client",
            json.dumps({**fleet, **spec}),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        # As a login sets it: without USER, asyncssh asks pwd for the local name, which under
        # EMFILE fails as a ValueError (an "internal error") rather than as the socket's EMFILE.
        env={**os.environ, "USER": "gpubot", "LOGNAME": "gpubot"},
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout), [ln for ln in p.stderr.splitlines() if ln]


def test_1500_nodes_answer_under_a_limit_of_1024_and_the_bot_says_why_it_closes(
    fleet: dict[str, Any],
) -> None:
    got, log = bot(fleet, soft=1024, hard=1024, nodes=NODES)
    assert got == {"ok": NODES, "failed": {}, "bad": 0}
    assert log == [
        "1500 nodes but the descriptor limit (1024) allows 896 SSH connections: idle ones are "
        "closed and reopened as needed (slower); raise LimitNOFILE to at least 1714 to keep "
        "one per node",
        "SSH connections at their cap of 896 (the descriptor limit): idle ones are closed to "
        "reach more nodes; raise LimitNOFILE to keep one per node",
    ]


def test_control_without_the_cap_nodes_fail_with_emfile(fleet: dict[str, Any]) -> None:
    got, _ = bot(fleet, soft=1024, hard=1024, nodes=NODES, cap=1_000_000)
    assert 0 < got["ok"] < NODES
    assert got["failed"] and all("Too many open files" in r for r in got["failed"]), got


def test_the_soft_limit_is_raised_to_the_hard_one_and_said(fleet: dict[str, Any]) -> None:
    got, log = bot(fleet, soft=1024, hard=4096, nodes=8, **{"raise": True})
    assert got == {"ok": 8, "failed": {}, "bad": 0}
    assert log == [
        "descriptor limit: soft raised from 1024 to 4096, hard 4096: up to 3584 SSH "
        "connections at once"
    ]
