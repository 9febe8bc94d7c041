"""Both SSH servers of the simulated fleet: real asyncssh and OpenSSH clients, every fault."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpubot.config import load
from gpubot.core.probe import nvsmi
from gpubot.errors import ParseError
from gpubot.transport.sshlib import asyncssh
from gpusim.fleet import SimFleet, SimNode
from gpusim.nvidia_smi import DRIVER_ERROR

GPU_Q = "--query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu"


@pytest.fixture(params=["asyncssh", "sshd"])
def fleet(request: pytest.FixtureRequest) -> SimFleet:
    """The module's asyncssh fleet, then its sshd fleet."""
    name = "sim_fleet" if request.param == "asyncssh" else "sshd_fleet"
    f: SimFleet = request.getfixturevalue(name)
    return f


@pytest.fixture
def node(fleet: SimFleet) -> Iterator[SimNode]:
    n = fleet.node("node2")
    n.clear()
    yield n
    n.clear()
    n.start_server()


def connect(fleet: SimFleet, node: SimNode, **kw: Any) -> Any:
    opts: dict[str, Any] = {
        "username": fleet.user,
        "client_keys": [str(fleet.client_key)],
        "known_hosts": str(fleet.known_hosts),
        "connect_timeout": 10,
    }
    opts.update(kw)
    return asyncssh.connect("127.0.0.1", node.port, **opts)


async def run(fleet: SimFleet, node: SimNode, cmd: str, **kw: Any) -> asyncssh.SSHCompletedProcess:
    async with connect(fleet, node) as conn:
        done: asyncssh.SSHCompletedProcess = await conn.run(cmd, check=False, **kw)
        return done


def test_inventory_loads_and_describes_the_fleet(fleet: SimFleet) -> None:
    s = load(fleet.config_path)
    assert [n.name for n in s.nodes] == [n.name for n in fleet.nodes]
    for cfg, node in zip(s.nodes, fleet.nodes, strict=True):
        assert (cfg.host, cfg.port, cfg.user) == ("127.0.0.1", node.port, fleet.user)
        assert cfg.key == str(fleet.client_key) and Path(cfg.key).stat().st_mode & 0o077 == 0
        assert cfg.dev_prefix == node.dev_prefix and cfg.device(0) == node.device(0)
        assert cfg.nvidia_smi == node.nvidia_smi
    assert s.groups()["sim"] == tuple(n.name for n in fleet.nodes)
    assert s.groups()["odd"][0] == "node1" and s.groups()["even"][0] == "node2"
    assert s.ssh.known_hosts == str(fleet.known_hosts)
    assert s.database_url.startswith("sqlite:///") and s.database_url.endswith("/gpubot.db")


def test_openssh_client_gets_what_nvidia_smi_prints(fleet: SimFleet, node: SimNode) -> None:
    w = node.spawn(gpu=1, mib=4321)
    local = subprocess.run([node.nvidia_smi, GPU_Q, "--format=csv"], capture_output=True, text=True)
    remote = subprocess.run(
        node.ssh_argv(node.nvidia_smi, GPU_Q, "--format=csv"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout == local.stdout
    apps = subprocess.run(
        node.ssh_argv(
            node.nvidia_smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader"
        ),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert apps.stdout == f"{w.pid}, 4321 MiB\n"


async def test_asyncssh_client_exit_status_streams_and_stdin(
    fleet: SimFleet, node: SimNode
) -> None:
    async with connect(fleet, node) as conn:
        r = await conn.run("printf out; printf err >&2; exit 3", check=False)
        assert (r.exit_status, r.stdout, r.stderr) == (3, "out", "err")
        r = await conn.run("cat", input="piped\n", check=False)
        assert (r.exit_status, r.stdout) == (0, "piped\n")
        r = await conn.run("kill -TERM $$", check=False)
        assert r.exit_signal is not None and r.exit_signal[0] == "TERM"
        r = await conn.run('echo "$USER $HOME"', check=False)
        assert r.stdout.split()[0] == fleet.user


async def test_wrong_user_and_unknown_host_key_are_refused(
    fleet: SimFleet, node: SimNode, tmp_path: Path
) -> None:
    with pytest.raises(asyncssh.PermissionDenied):
        async with connect(fleet, node, username="gpusim-nobody"):
            pass
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().split()
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{node.port} {other[0]} {other[1]}\n")
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        async with connect(fleet, node, known_hosts=str(wrong)):
            pass


async def until(cond: Any, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return bool(cond())


async def test_hang_fault_never_answers_and_the_call_goes_away_with_the_client(
    fleet: SimFleet, node: SimNode
) -> None:
    node.set_fault("hang")
    async with connect(fleet, node) as conn:
        proc = await conn.create_process(f"{node.nvidia_smi} -L")
        assert await until(lambda: bool(node.hung_smi()))  # it hangs on the node ...
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), 0.5)  # ... and says nothing
        proc.close()
    assert await until(lambda: not node.hung_smi())  # gone once nobody can read its answer


async def test_slow_fault_delays_the_answer(fleet: SimFleet, node: SimNode) -> None:
    node.set_fault("slow", delay_s=0.6)
    t0 = time.monotonic()
    r = await run(fleet, node, f"{node.nvidia_smi} -L")
    assert r.exit_status == 0 and str(r.stdout).startswith("GPU 0: NVIDIA H200 (UUID: GPU-")
    assert time.monotonic() - t0 >= 0.6


async def test_missing_fault_is_exit_127_from_the_shell(fleet: SimFleet, node: SimNode) -> None:
    node.set_fault("missing")
    r = await run(fleet, node, f"{node.nvidia_smi} -L")
    assert r.exit_status == 127
    assert "No such file or directory" in str(r.stderr) or "not found" in str(r.stderr)
    node.set_fault(None)
    assert (await run(fleet, node, f"{node.nvidia_smi} -L")).exit_status == 0


async def test_garbled_fault_breaks_the_parser(fleet: SimFleet, node: SimNode) -> None:
    node.set_fault("garbled")
    r = await run(fleet, node, f"{node.nvidia_smi} {GPU_Q} --format=csv,noheader,nounits")
    assert r.exit_status == 0
    assert "1949090, 0 MiB" in str(r.stdout).splitlines()
    with pytest.raises(ParseError):
        nvsmi.parse_gpus(str(r.stdout))


async def test_driver_error_fault_is_exit_9(fleet: SimFleet, node: SimNode) -> None:
    node.set_fault("driver-error")
    r = await run(fleet, node, f"{node.nvidia_smi} {GPU_Q} --format=csv")
    assert (r.exit_status, r.stdout) == (9, DRIVER_ERROR)
    assert node.state()["fault"] == {"kind": "driver-error"}


async def test_stopped_server_refuses_and_restarts_on_the_same_port(
    fleet: SimFleet, node: SimNode
) -> None:
    port = node.port
    async with connect(fleet, node) as conn:
        node.stop_server()
        with pytest.raises((OSError, asyncssh.Error)):  # the open connection dropped too
            await conn.run("true", check=True, timeout=5)
    with pytest.raises(ConnectionRefusedError):
        async with connect(fleet, node):
            pass
    node.start_server()
    assert node.port == port
    assert (await run(fleet, node, "echo back")).stdout == "back\n"  # same host key


async def test_hung_endpoint_accepts_tcp_and_never_speaks(fleet: SimFleet, node: SimNode) -> None:
    node.hang_server()
    with socket.create_connection(("127.0.0.1", node.port), timeout=2) as s:
        s.settimeout(0.3)
        with pytest.raises(TimeoutError):
            s.recv(1)  # no SSH banner, ever
    with pytest.raises((asyncssh.Error, TimeoutError, asyncio.TimeoutError)):
        async with connect(fleet, node, login_timeout=0.5, connect_timeout=0.5):
            pass
    node.start_server()
    assert (await run(fleet, node, "echo up")).exit_status == 0


async def test_asyncssh_server_kills_the_command_of_a_client_that_left(
    sim_fleet: SimFleet,
) -> None:
    node = sim_fleet.node("node3")
    async with connect(sim_fleet, node) as conn:
        proc = await conn.create_process("echo $$; exec sleep 30")
        pid = int(await asyncio.wait_for(proc.stdout.readline(), 10))
        assert Path(f"/proc/{pid}").exists()
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists()


async def test_a_session_left_in_a_full_channel_closes_its_pipes(sim_fleet: SimFleet) -> None:
    """A client that stops reading and leaves: the server's pump is stopped in a full channel,
    its pipe short of EOF. That pipe is closed when the session ends, not left open until this
    process exits (an unclosed transport, whichever later test's collection finds it)."""
    node = sim_fleet.node("node3")
    unclosed: list[str] = []
    hook = sys.unraisablehook
    sys.unraisablehook = lambda u: unclosed.append(repr(u.exc_value))
    try:
        async with connect(sim_fleet, node) as conn:
            proc = await conn.create_process("echo $$; exec head -c 20000000 /dev/zero")
            pid = int(await asyncio.wait_for(proc.stdout.readline(), 10))
            pipe = os.readlink(f"/proc/{pid}/fd/1")  # the server's end reads this pipe
            assert pipe.startswith("pipe:")
            await asyncio.sleep(0.5)  # the channel's window fills: the server's pump waits
            proc.close()  # the channel goes, the connection stays (as a capped read leaves it)
            deadline = time.monotonic() + 15
            while pipe in _fds() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        gc.collect()  # a transport left open is reported here (the control: it is)
    finally:
        sys.unraisablehook = hook
    assert pipe not in _fds()
    assert not [u for u in unclosed if "unclosed" in u], unclosed


def _fds() -> set[str]:
    """What this process's descriptors point to."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            out.add(os.readlink(f"/proc/self/fd/{fd}"))
    return out


async def test_every_behaviour_seen_and_signalled_over_ssh(fleet: SimFleet, node: SimNode) -> None:
    node.release_delay_s = 0.3
    kinds = ["normal", "stubborn", "slow", "respawn", "orphan", "hidden"]
    w = {
        k: node.spawn(gpu=i, mib=1000 + i, behaviour=k, slow_exit_s=1.5)
        for i, k in enumerate(kinds)
    }
    ctl = node.spawn(gpu=None, behaviour="ctl-only")
    smi = node.nvidia_smi
    async with connect(fleet, node) as conn:

        async def sh(cmd: str) -> str:
            r = await conn.run(cmd, check=False)
            return str(r.stdout) + str(r.stderr)

        async def look() -> tuple[dict[int, int], list[int]]:
            """One SSH session: the listed processes, then memory used per GPU."""
            out = await sh(
                f"{smi} --query-compute-apps=pid,used_memory --format=csv,noheader,nounits;"
                f" echo --; {smi} --query-gpu=memory.used --format=csv,noheader,nounits"
            )
            apps, mem = out.split("--\n")
            rows = (line.split(", ") for line in apps.splitlines())
            return {int(p): int(m) for p, m in rows}, [int(x) for x in mem.split()]

        async def look_until(
            done: Callable[[dict[int, int], list[int]], bool], what: str
        ) -> tuple[dict[int, int], list[int]]:
            """Look again until ``done`` holds (a loaded machine answers late), at most 20 s."""
            deadline = time.monotonic() + 20
            while not done(*(seen := await look())):
                assert time.monotonic() < deadline, f"timed out waiting for {what}: {seen}"
                await asyncio.sleep(0.05)
            return seen

        listed, mem = await look()
        assert listed == {w[k].pid: 1000 + i for i, k in enumerate(kinds) if k != "hidden"}
        assert mem[:6] == [1000, 1001, 1002, 1003, 1004, 1005]
        table = " ".join((await sh(f"fuser -v {node.device(5)} {node.dev_prefix}ctl 2>&1")).split())
        assert f"{w['hidden'].pid} F...m" in table  # fuser sees the hidden one
        assert f"{ctl.pid} F...m" in table
        await sh("kill -TERM " + " ".join(str(w[k].pid) for k in kinds))
        killed = time.monotonic()
        listed, _ = await look_until(lambda ls, _: w["normal"].pid not in ls, "normal to exit")
        assert w["stubborn"].pid in listed
        if time.monotonic() - killed < 1.4:  # (a loaded machine may answer later than that)
            assert w["slow"].pid in listed  # still shutting down
        # the slow one's 1.5 s, then the 0.3 s release delay; the respawned child shows up
        listed, mem = await look_until(
            lambda ls, m: (
                w["slow"].pid not in ls and m[0] == m[2] == m[5] == 0 and 1003 in ls.values()
            ),
            "slow to exit, memory to be released and respawn to come back",
        )
        assert w["slow"].pid not in listed and w["orphan"].pid not in listed
        respawned = [p for p, m in listed.items() if m == 1003]
        assert len(respawned) == 1 and respawned[0] != w["respawn"].pid
        assert mem[0] == 0 and mem[2] == 0 and mem[5] == 0  # released after the delay
        assert mem[4] == 1004  # the orphan's memory leaked
        assert "successfully reset" in await sh(
            f"{smi} --gpu-reset -i 4; kill -KILL {w['stubborn'].pid}"
        )
        await look_until(
            lambda ls, m: m[4] == 0 and w["stubborn"].pid not in ls,
            "GPU 4 reset and stubborn killed",
        )
