"""The Transport contract, run against every adapter.

The SSH transport runs against the simulated fleet served by asyncssh's server AND by OpenSSH
``sshd`` (real SSH, real processes); the local transport runs the same command contract here. NVML
is exercised with an injected fake of the small pynvml surface gpubot uses; the real pynvml on a
box without a GPU shows the fallback to nvidia-smi.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpubot.config import Settings, SshSettings, load
from gpubot.core.flags import gpu_flags
from gpubot.core.models import CommandResult, ComputeApp, GpuInfo, NodeConfig
from gpubot.core.ports import Transport
from gpubot.errors import (
    AuthRefused,
    CommandTimeout,
    HostKeyRejected,
    NodeUnreachable,
    ParseError,
    SmiFailed,
    SmiMissing,
    UsageError,
)
from gpubot.services.status import probe_node
from gpubot.transport import LocalTransport, SshTransport, make_transport, nvml_query
from gpubot.transport.local import missing_functions
from tests.procs import alive, cmdlines, until

try:
    from gpusim.fleet import SimFleet
except ImportError:  # pragma: no cover - the simulated fleet is another engineer's module
    SimFleet = None  # type: ignore[assignment,misc]


@dataclass
class World:
    kind: str  # "asyncssh" | "sshd" | "local"
    settings: Settings
    fleet: Any  # SimFleet, or None for the local box


NASTY = [
    "plain",
    "two words",
    "it's",
    'say "hi"',
    "$(touch /tmp/gpubot-pwned)",
    "`id`",
    "a; echo injected",
    "x && y || z",
    "$HOME ${PATH}",
    "*",
    "back\\slash",
    "new\nline",
    "tab\tchar",
    "",
    "-n",
    "ünï©ødé",
]


# ---- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Simulated fleets by server kind, started on first use, stopped at the end of the module."""
    started: dict[str, Any] = {}
    try:
        yield started
    finally:
        for fleet in started.values():
            fleet.stop()


def _world(kind: str, fleets: dict[str, Any], tmp: pytest.TempPathFactory) -> World:
    if kind == "local":
        return World(kind, Settings(nodes=(NodeConfig(name="here", host="local"),)), None)
    if SimFleet is None:
        pytest.fail("gpusim.fleet is missing: the transport contract needs the simulated fleet")
    if kind not in fleets:
        fleet = SimFleet(tmp.mktemp(f"fleet-{kind}"), nodes=2, gpus=4, server=kind)
        fleet.start()
        fleets[kind] = fleet
    fleet = fleets[kind]
    return World(kind, load(fleet.config_path), fleet)


@pytest.fixture(params=["asyncssh", "sshd", "local"])
def world(
    request: pytest.FixtureRequest, fleets: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> World:
    """Every adapter: SSH to both server kinds, and the local box."""
    return _world(request.param, fleets, tmp_path_factory)


@pytest.fixture(params=["asyncssh", "sshd"])
def ssh_world(
    request: pytest.FixtureRequest, fleets: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> World:
    """SSH to both server kinds."""
    return _world(request.param, fleets, tmp_path_factory)


@pytest.fixture
async def transport(world: World) -> AsyncIterator[Transport]:
    t: Transport
    t = (
        LocalTransport(world.settings.ssh)
        if world.kind == "local"
        else SshTransport(world.settings.ssh)
    )
    try:
        yield t
    finally:
        await t.close()


@pytest.fixture
async def ssh(ssh_world: World) -> AsyncIterator[SshTransport]:
    t = SshTransport(ssh_world.settings.ssh)
    try:
        yield t
    finally:
        await t.close()


def node_of(world: World) -> NodeConfig:
    return world.settings.nodes[0]


# ---- the command contract (every adapter) -------------------------------------------------------


async def test_stdout_stderr_and_exit_status(world: World, transport: Transport) -> None:
    node = node_of(world)
    r = await transport.run(node, ["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert (r.exit_status, r.stdout, r.stderr) == (7, "out\n", "err\n")
    assert r.argv == ("sh", "-c", "echo out; echo err >&2; exit 7")
    ok = await transport.run(node, ["true"])
    assert ok.exit_status == 0 and ok.stdout == ok.stderr == ""


async def test_missing_program_is_exit_127(world: World, transport: Transport) -> None:
    r = await transport.run(node_of(world), ["gpubot-no-such-program", "x"])
    assert r.exit_status == 127


async def test_nasty_arguments_arrive_verbatim(world: World, transport: Transport) -> None:
    python = sys.executable if world.kind == "local" else "python3"
    code = "import sys, json; print(json.dumps(sys.argv[1:]))"
    r = await transport.run(node_of(world), [python, "-c", code, *NASTY])
    assert r.exit_status == 0, r.stderr
    assert json.loads(r.stdout) == NASTY
    assert not _exists("/tmp/gpubot-pwned")


async def test_unexecutable_argv_is_refused_before_sending(
    world: World, transport: Transport
) -> None:
    with pytest.raises(UsageError, match="NUL"):
        await transport.run(node_of(world), ["echo", "a\0b"])
    with pytest.raises(UsageError, match="empty"):
        await transport.run(node_of(world), [])


async def test_stdin_is_closed(world: World, transport: Transport) -> None:
    r = await transport.run(node_of(world), ["cat"], timeout=5)
    assert (r.exit_status, r.stdout) == (0, "")


async def test_command_timeout_abandons_the_command(world: World, transport: Transport) -> None:
    node = node_of(world)
    t0 = time.monotonic()
    with pytest.raises(CommandTimeout) as ei:
        await transport.run(node, ["sleep", "5"], timeout=0.5)
    assert ei.value.node == node.name and "0.5s" in ei.value.reason
    assert isinstance(ei.value, TimeoutError)
    assert time.monotonic() - t0 < 2.5
    # The transport stays usable after a timeout.
    assert (await transport.run(node, ["echo", "still here"])).stdout == "still here\n"


async def test_binary_output_is_replaced_not_fatal(world: World, transport: Transport) -> None:
    r = await transport.run(node_of(world), ["printf", "a\\377b"])
    assert r.exit_status == 0 and r.stdout == "a\ufffdb"


# ---- SSH only (both server kinds) ---------------------------------------------------------------


async def test_one_connection_shared_by_concurrent_commands(
    ssh_world: World, ssh: SshTransport
) -> None:
    node = node_of(ssh_world)
    results = await asyncio.gather(
        *(ssh.run(node, ["sh", "-c", f"sleep 0.2; echo {i}"]) for i in range(24))
    )
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(24)]
    # 24 concurrent first calls made ONE connection (more sessions than sshd's MaxSessions=10).
    assert ssh.connected() == 1 and ssh.connections_made == 1
    await ssh.run(ssh_world.settings.nodes[1], ["true"])
    assert ssh.connected() == 2
    await ssh.close()
    assert ssh.connected() == 0


async def test_waiting_for_a_session_slot_counts_against_the_timeout(ssh_world: World) -> None:
    t = SshTransport(ssh_world.settings.ssh, max_channels=1)
    node = node_of(ssh_world)
    try:
        token = f"gpubot-slot-{os.getpid()}-{time.monotonic_ns()}"
        busy = asyncio.create_task(t.run(node, ["sh", "-c", f"sleep 2; : {token}"]))
        # the busy command runs, so it holds the only slot (for 2 s more at least)
        await until(lambda: any(token in c for c in cmdlines().values()), 30, "the busy command")
        with pytest.raises(CommandTimeout, match="no free SSH session"):
            await t.run(node, ["true"], timeout=0.3)
        assert (await busy).exit_status == 0
        assert (await t.run(node, ["true"])).exit_status == 0  # the slot was given back
    finally:
        await t.close()


async def test_reconnects_after_server_restart(ssh_world: World, ssh: SshTransport) -> None:
    node = node_of(ssh_world)
    sim = ssh_world.fleet.node(node.name)
    assert (await ssh.run(node, ["echo", "1"])).stdout == "1\n"
    sim.stop_server()
    try:
        with pytest.raises(NodeUnreachable):
            await ssh.run(node, ["echo", "2"])
    finally:
        sim.start_server()
    # The dead connection is noticed and redone, transparently.
    assert (await ssh.run(node, ["echo", "3"])).stdout == "3\n"
    assert ssh.connected() == 1
    sim.stop_server()
    sim.start_server()  # restarted between two commands, unseen by the transport
    assert (await ssh.run(node, ["echo", "4"])).stdout == "4\n"
    assert ssh.connected() == 1 and ssh.connections_made == 3


async def test_unreachable_port(ssh_world: World, ssh: SshTransport) -> None:
    node = replace(node_of(ssh_world), port=_free_port())
    with pytest.raises(NodeUnreachable, match="refused") as ei:
        await ssh.run(node, ["true"])
    assert isinstance(ei.value, ConnectionError)


async def test_hung_ssh_endpoint_is_unreachable(ssh_world: World) -> None:
    with socket.socket() as ls:
        ls.bind(("127.0.0.1", 0))
        ls.listen()  # accepts TCP, never speaks SSH
        node = replace(node_of(ssh_world), port=ls.getsockname()[1])
        t = SshTransport(replace(ssh_world.settings.ssh, connect_timeout_s=0.5))
        t0 = time.monotonic()
        try:
            with pytest.raises(NodeUnreachable, match="no SSH answer"):
                await t.run(node, ["true"])
        finally:
            await t.close()
        assert time.monotonic() - t0 < 3


async def test_changed_host_key_is_refused(ssh_world: World, tmp_path: Path) -> None:
    # Same host patterns, another key: what a man in the middle would present.
    known = _swap_keys(Path(ssh_world.settings.ssh.known_hosts), tmp_path)
    t = SshTransport(replace(ssh_world.settings.ssh, known_hosts=str(known)))
    try:
        with pytest.raises(HostKeyRejected, match="CHANGED"):
            await t.run(node_of(ssh_world), ["true"])
    finally:
        await t.close()


async def test_known_hosts_is_parsed_once_and_reread_when_it_changes(
    ssh_world: World, tmp_path: Path
) -> None:
    good = tmp_path / "known_hosts"
    good.write_text(Path(ssh_world.settings.ssh.known_hosts).read_text())
    t = SshTransport(replace(ssh_world.settings.ssh, known_hosts=str(good)))
    first, second = ssh_world.settings.nodes[0], ssh_world.settings.nodes[1]
    try:
        await t.run(first, ["true"])
        parsed = t._files[str(good)][1]
        await t.run(second, ["true"])
        assert t._files[str(good)][1] is parsed  # one parse, shared by both connections
        # The file now says another key (a rotation, or a revoked one): the next connect obeys.
        good.write_text(_swap_keys(good, tmp_path).read_text())
        await t.close()
        with pytest.raises(HostKeyRejected, match="CHANGED"):
            await t.run(first, ["true"])
    finally:
        await t.close()


async def test_unknown_host_is_refused(ssh_world: World, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    _write(empty, "")
    for path, match in ((empty, "unknown"), (tmp_path / "absent", "cannot read known_hosts")):
        t = SshTransport(replace(ssh_world.settings.ssh, known_hosts=str(path)))
        try:
            with pytest.raises(HostKeyRejected, match=match):
                await t.run(node_of(ssh_world), ["true"])
        finally:
            await t.close()


async def test_auth_refused_with_another_key(
    ssh_world: World, ssh: SshTransport, tmp_path: Path
) -> None:
    _keygen(tmp_path / "stranger")
    node = replace(node_of(ssh_world), key=str(tmp_path / "stranger"))
    with pytest.raises(AuthRefused, match="refused our key") as ei:
        await ssh.run(node, ["true"])
    assert isinstance(ei.value, PermissionError)
    with pytest.raises(AuthRefused, match="cannot load key"):
        await ssh.run(replace(node, key=str(tmp_path / "absent")), ["true"])


# ---- the probe end to end against the simulated fleet -----------------------------------------


async def test_probe_matches_the_sim(ssh_world: World, ssh: SshTransport) -> None:
    node = node_of(ssh_world)
    sim = ssh_world.fleet.node(node.name)
    seen = sim.spawn(gpu=1, mib=2048)
    hidden = sim.spawn(gpu=2, mib=1024, behaviour="hidden")
    ctl = sim.spawn(gpu=None, behaviour="ctl-only")
    runs: list[list[str]] = []
    counting = _Counting(ssh, runs)
    try:
        snap = await probe_node(counting, node, smi_timeout_s=5, taken_at=123.0)
        assert len(runs) == 1  # one remote exec per snapshot
        state = sim.state()
        assert snap.node == node.name and snap.taken_at == 123.0
        assert [g.index for g in snap.gpus] == list(range(4))
        for g, want in zip(snap.gpus, state["gpus"], strict=True):
            assert (g.index, g.uuid, g.name) == (want["index"], want["uuid"], want["name"])
            assert g.memory_used_mib == want["memory_used_mib"]
            assert g.memory_total_mib == want["memory_total_mib"] == 143771
            assert g.utilization_pct == want["utilization_pct"]
        g1, g2 = snap.gpu(1), snap.gpu(2)
        assert g1 is not None and g1.memory_used_mib is not None and g1.memory_used_mib >= 2048
        assert g2 is not None and g2.memory_used_mib is not None and g2.memory_used_mib >= 1024
        procs = {(p.pid, p.gpu_index): p for p in snap.processes}
        p = procs[(seen.pid, 1)]
        assert p.visible_to_nvidia_smi and p.holds_device_file and p.used_memory_mib == 2048
        assert p.start_ticks == seen.start_ticks and p.state in ("S", "R")
        h = procs[(hidden.pid, 2)]
        assert h.hidden and h.used_memory_mib is None and h.start_ticks == hidden.start_ticks
        assert [c.pid for c in snap.ctl_only] == [ctl.pid]
        assert all(pid != ctl.pid for pid, _ in procs)
        # Only GPU 3 is asked for: nothing from GPUs 1-2.
        only3 = await probe_node(ssh, node, smi_timeout_s=5, taken_at=1.0, gpu_indices=[3])
        assert [g.index for g in only3.gpus] == [3] and only3.processes == ()
        assert ssh.connected() == 1
    finally:
        for w in (seen, hidden, ctl):
            _kill(w)


@pytest.mark.parametrize(
    ("fault", "error", "match"),
    [
        ("missing", SmiMissing, "not found"),
        ("driver-error", SmiFailed, "couldn't communicate with the NVIDIA driver"),
        ("hang", SmiFailed, "hung"),
        ("garbled", ParseError, "cannot parse"),
    ],
)
async def test_probe_maps_each_nvidia_smi_fault(
    ssh_world: World, ssh: SshTransport, fault: str, error: type, match: str
) -> None:
    node = node_of(ssh_world)
    sim = ssh_world.fleet.node(node.name)
    w = sim.spawn(gpu=0, mib=512)  # garbling interleaves process lines
    sim.set_fault(fault)
    try:
        with pytest.raises(error, match=match):
            await probe_node(ssh, node, smi_timeout_s=1, taken_at=0.0)
    finally:
        sim.set_fault(None)
        _kill(w)
    snap = await probe_node(ssh, node, smi_timeout_s=5, taken_at=0.0)  # healthy again
    assert len(snap.gpus) == 4


class _Counting:
    """A transport that records each command it passes on."""

    def __init__(self, inner: Transport, runs: list[list[str]]) -> None:
        self.inner, self.runs = inner, runs

    async def run(
        self, node: NodeConfig, argv: Sequence[str], *, timeout: float | None = None
    ) -> CommandResult:
        self.runs.append(list(argv))
        return await self.inner.run(node, argv, timeout=timeout)

    async def close(self) -> None:
        await self.inner.close()


def _exists(path: str) -> bool:
    return Path(path).exists()


def _write(path: Path, text: str) -> None:
    path.write_text(text)


def _swap_keys(known_hosts: Path, tmp: Path) -> Path:
    _keygen(tmp / "other")
    other = (tmp / "other.pub").read_text().split()
    lines = [ln.split() for ln in known_hosts.read_text().splitlines() if ln.strip()]
    out = tmp / "known_hosts_changed"
    out.write_text("".join(f"{ln[0]} {other[0]} {other[1]}\n" for ln in lines))
    return out


def _kill(w: Any) -> None:
    """Kill a workload this test spawned (by its PID, never by name)."""
    for pid in {w.pid, getattr(w, "supervisor_pid", None)} - {None}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(path: Path) -> None:
    from gpubot.transport.sshlib import asyncssh

    key = asyncssh.generate_private_key("ssh-ed25519")
    key.write_private_key(str(path))
    key.write_public_key(str(path) + ".pub")
    path.chmod(0o600)


# ---- the local transport: NVML and its fallback -----------------------------------------------


class FakeNvml:
    """The small pynvml surface gpubot uses, with NVML's error codes and pynvml's quirks.

    ``missing``: functions this driver's library lacks (FUNCTION_NOT_FOUND, 13); ``fail``: NVML
    errors by (handle, function), e.g. ``{(1, "nvmlDeviceGetHandleByIndex"): 15}`` for a GPU
    lost before its handle; a MIG device's handle is (GPU index, slot). ``calls`` counts every
    call by function name.
    """

    nvmlMemory_v2 = 0x02000028

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(f"NVML error {value}")
            self.value = value

    class NVMLLibraryMismatchError(Exception):
        """What pynvml's unversioned call raises when the library lacks that version."""

    def __init__(
        self,
        *,
        init_error: int | None = None,
        v2: bool = True,
        missing: Sequence[str] = (),
        fail: dict[tuple[Any, str], int] | None = None,
    ) -> None:
        self.init_error = init_error
        self.missing = set(missing) | (set() if v2 else {"nvmlDeviceGetMemoryInfo_v2"})
        self.fail: dict[tuple[Any, str], int] = dict(fail or {})
        self.calls: Counter[str] = Counter()
        self.inits = self.shutdowns = 0
        gib = 1024**3
        self.devices: list[dict[str, Any]] = [
            dict(
                uuid=b"GPU-00000000-1111-2222-3333-444444444444",
                name=b"NVIDIA H200",
                used=3 * gib + 5,
                reserved_extra=512 * 1024**2,
                total=143771 * 1024**2,
                util=37,
                procs=[(4242, 2 * gib), (4343, None)],
                mig=None,
                instances=[],
            ),
            dict(
                uuid="GPU-55555555-6666-7777-8888-999999999999",
                name="NVIDIA H200",
                used=0,
                reserved_extra=0,
                total=143771 * 1024**2,
                util=None,
                procs=[],
                mig=None,
                instances=[],
            ),
        ]
        # mig: None (MIG NOT_SUPPORTED) or (current, pending); instances: one entry per MIG slot,
        # None for an empty one (NOT_FOUND), else that instance's (pid, bytes) processes.
        self.minors = [1, None]  # GPU 0 is /dev/nvidia1; GPU 1's minor NVML cannot say

    def _call(self, fn: str, h: Any = None) -> dict[str, Any]:
        """Count a call; raise what this driver says to it; return the device's record."""
        self.calls[fn] += 1
        if fn in self.missing:
            raise self.NVMLError(13)  # FUNCTION_NOT_FOUND: an older driver's library
        code = self.fail.get((h, fn))  # h: a GPU's index, or a MIG device's (index, slot)
        if code is not None:
            raise self.NVMLError(code)
        return self.devices[h[0] if isinstance(h, tuple) else h]

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.NVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        self._call("nvmlDeviceGetHandleByIndex", i)
        return i

    def nvmlDeviceGetIndex(self, h: int) -> int:
        self._call("nvmlDeviceGetIndex", h)
        return h

    def nvmlDeviceGetUUID(self, h: int) -> Any:
        return self._call("nvmlDeviceGetUUID", h)["uuid"]

    def nvmlDeviceGetName(self, h: int) -> Any:
        return self._call("nvmlDeviceGetName", h)["name"]

    def nvmlDeviceGetMemoryInfo(self, h: int, version: int | None = None) -> Any:
        d = self._call("nvmlDeviceGetMemoryInfo" + ("_v2" if version else ""), h)
        if version is not None:
            return SimpleNamespace(used=d["used"], total=d["total"])
        return SimpleNamespace(used=d["used"] + d["reserved_extra"], total=d["total"])

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        d = self._call("nvmlDeviceGetUtilizationRates", h)
        if d["util"] is None:
            raise self.NVMLError(3)  # NOT_SUPPORTED (e.g. MIG mode)
        return SimpleNamespace(gpu=d["util"], memory=0)

    def _procs(self, fn: str, h: Any) -> list[Any]:
        d = self._call(fn, h)
        procs = d["instances"][h[1]] if isinstance(h, tuple) else d["procs"]
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in procs]

    def nvmlDeviceGetComputeRunningProcesses_v3(self, h: Any) -> list[Any]:
        return self._procs("nvmlDeviceGetComputeRunningProcesses_v3", h)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, h: Any) -> list[Any]:
        return self._procs("nvmlDeviceGetComputeRunningProcesses_v2", h)

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        try:  # as pynvml: the unversioned call is v3, and a missing v3 is a mismatch
            return self._procs("nvmlDeviceGetComputeRunningProcesses_v3", h)
        except self.NVMLError as exc:
            if exc.value == 13:
                raise self.NVMLLibraryMismatchError("use a versioned function") from None
            raise

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        self._call("nvmlDeviceGetPciInfo", h)
        return SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0".encode())

    def nvmlDeviceGetMinorNumber(self, h: int) -> int:
        self._call("nvmlDeviceGetMinorNumber", h)
        minor = self.minors[h]
        if minor is None:
            raise self.NVMLError(3)  # NOT_SUPPORTED
        return minor

    def nvmlDeviceGetMigMode(self, h: int) -> list[int]:
        mig = self._call("nvmlDeviceGetMigMode", h)["mig"]
        if mig is None:
            raise self.NVMLError(3)  # NOT_SUPPORTED: no MIG on this GPU
        return list(mig)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: int) -> int:
        return len(self._call("nvmlDeviceGetMaxMigDeviceCount", h)["instances"])

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: int, j: int) -> tuple[int, int]:
        if self._call("nvmlDeviceGetMigDeviceHandleByIndex", h)["instances"][j] is None:
            raise self.NVMLError(6)  # NOT_FOUND: no instance in that slot
        return (h, j)


GPU0 = "GPU-00000000-1111-2222-3333-444444444444"
GPU1 = "GPU-55555555-6666-7777-8888-999999999999"
H200_0 = GpuInfo(0, GPU0, "NVIDIA H200", 3072, 143771, 37, "00000000:18:00.0", 1)
H200_1 = GpuInfo(1, GPU1, "NVIDIA H200", 0, 143771, None, "00000000:19:00.0", None)


def test_nvml_tables_convert() -> None:
    fake = FakeNvml()
    gpus, apps = nvml_query("box", nvml=fake)
    assert gpus == (H200_0, H200_1)
    assert apps == (
        ComputeApp(4242, gpus[0].uuid, 2048),  # no name asked of NVML: the process's own say
        ComputeApp(4343, gpus[0].uuid, None),
    )
    assert fake.inits == fake.shutdowns == 1
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 2  # the newest call first
    # An old driver without the v2 memory call: v1 counts reserved memory as used.
    gpus_v1, _ = nvml_query("box", nvml=FakeNvml(v2=False))
    assert gpus_v1[0].memory_used_mib == 3072 + 512


def test_nvml_errors() -> None:
    with pytest.raises(SmiMissing, match="not found"):
        nvml_query("box", nvml=FakeNvml(init_error=12))  # LIBRARY_NOT_FOUND
    with pytest.raises(SmiFailed, match="NVML init failed"):
        nvml_query("box", nvml=FakeNvml(init_error=9))  # DRIVER_NOT_LOADED
    # Any other error fails NVML for the node: the probe then asks nvidia-smi, which says it.
    for fn, code in (
        ("nvmlDeviceGetComputeRunningProcesses_v3", 999),  # UNKNOWN
        ("nvmlDeviceGetComputeRunningProcesses_v3", 4),  # NO_PERMISSION, no MIG
        ("nvmlDeviceGetHandleByIndex", 4),
        ("nvmlDeviceGetUUID", 3),
    ):
        broken = FakeNvml(fail={(1, fn): code})
        with pytest.raises(SmiFailed, match="NVML"):
            nvml_query("box", nvml=broken)
        assert broken.shutdowns == 1


@pytest.mark.parametrize("code, flag", [(15, "lost"), (16, "requires-reset")])
def test_nvml_gpu_lost_before_its_handle(code: int, flag: str) -> None:
    """GPU_IS_LOST (15) / RESET_REQUIRED (16) for a handle: a row of unknowns, the rest listed."""
    fake = FakeNvml(fail={(0, "nvmlDeviceGetHandleByIndex"): code})
    gpus, apps = nvml_query("box", nvml=fake)
    assert gpus == (GpuInfo(0, "", "?", None, None, None, None, None, (flag,)), H200_1)
    assert apps == ()  # GPU 0's processes are not known; nothing is put on another GPU
    assert fake.calls["nvmlDeviceGetUUID"] == 1 and fake.shutdowns == 1


@pytest.mark.parametrize(
    "fn",
    [
        "nvmlDeviceGetIndex",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetMinorNumber",
    ],
)
def test_nvml_gpu_lost_in_any_read(fn: str) -> None:
    """GPU_IS_LOST on any one call: that GPU is a lost row, never a failed node."""
    gpus, apps = nvml_query("box", nvml=FakeNvml(fail={(0, fn): 15}))
    bus = None if fn == "nvmlDeviceGetPciInfo" else "00000000:18:00.0"  # what it still says
    minor = None if fn == "nvmlDeviceGetMinorNumber" else 1
    assert gpus == (GpuInfo(0, "", "?", None, None, None, bus, minor, ("lost",)), H200_1)
    assert apps == ()  # what was read of GPU 0 before it was lost is dropped


def test_nvml_gpu_lost_in_a_mig_instance() -> None:
    fake = FakeNvml(fail={(0, "nvmlDeviceGetComputeRunningProcesses_v3"): 15})
    fake.devices[1].update(mig=(1, 1), instances=[[(77, None)]])
    gpus, apps = nvml_query("box", nvml=fake)
    assert [g.flags for g in gpus] == [("lost",), ("mig",)]
    assert apps == (ComputeApp(77, GPU1, None),)
    for fail in (
        {(1, "nvmlDeviceGetMigDeviceHandleByIndex"): 15},
        {((1, 0), "nvmlDeviceGetComputeRunningProcesses_v3"): 15},
    ):
        fake.fail = fail
        gpus, apps = nvml_query("box", nvml=fake)
        assert gpus == (
            H200_0,
            GpuInfo(1, "", "?", None, None, None, "00000000:19:00.0", None, ("lost",)),
        )
        assert {a.gpu_uuid for a in apps} == {GPU0}  # GPU 1's instance process is dropped


def test_nvml_reset_required_in_a_read() -> None:
    """RESET_REQUIRED on one value: None and a flag, the rest of the GPU still read."""
    gpus, apps = nvml_query("box", nvml=FakeNvml(fail={(0, "nvmlDeviceGetUtilizationRates"): 16}))
    assert gpus == (replace(H200_0, utilization_pct=None, flags=("requires-reset",)), H200_1)
    assert {a.pid for a in apps} == {4242, 4343}
    # Without its uuid, its processes cannot be put on it: none listed, none put elsewhere.
    gpus, apps = nvml_query("box", nvml=FakeNvml(fail={(0, "nvmlDeviceGetUUID"): 16}))
    assert gpus == (replace(H200_0, uuid="", flags=("requires-reset",)), H200_1)
    assert apps == ()
    # On the process list: memory and the rest known, the processes not.
    fail = {(0, "nvmlDeviceGetComputeRunningProcesses_v3"): 16}
    gpus, apps = nvml_query("box", nvml=FakeNvml(fail=fail))
    assert gpus[0] == replace(H200_0, flags=("requires-reset",)) and apps == ()


def test_nvml_mig_gpu_lists_every_instance() -> None:
    gib = 1024**3
    fake = FakeNvml()
    slots = [[(5001, gib)], None, [(5002, None), (5003, 2 * gib)]]  # None: an empty slot
    fake.devices[0].update(mig=(1, 1), util=None, procs=[(5001, gib)], instances=slots)
    fake.devices[1].update(mig=(0, 1))  # MIG pending (after a reset): not in MIG mode yet
    gpus, apps = nvml_query("box", nvml=fake)
    assert gpus == (replace(H200_0, utilization_pct=None, flags=("mig",)), H200_1)
    assert apps == (  # against the parent GPU: a reset of it lists every instance's processes
        ComputeApp(5001, GPU0, 1024),
        ComputeApp(5002, GPU0, None),
        ComputeApp(5003, GPU0, 2048),
    )
    assert fake.calls["nvmlDeviceGetMigDeviceHandleByIndex"] == 3
    assert fake.calls["nvmlDeviceGetMaxMigDeviceCount"] == 1  # GPU 1 is not in MIG mode
    # An unprivileged caller: the parent's list is refused, the instances' still read.
    fake.fail = {(0, "nvmlDeviceGetComputeRunningProcesses_v3"): 4}  # NO_PERMISSION
    _, apps = nvml_query("box", nvml=fake)
    assert [a.pid for a in apps] == [5001, 5002, 5003]
    # An instance's list refused: not known to be idle, so NVML fails and nvidia-smi answers.
    fake.fail = {((0, 2), "nvmlDeviceGetComputeRunningProcesses_v3"): 4}
    with pytest.raises(SmiFailed):
        nvml_query("box", nvml=fake)


def test_nvml_remembers_functions_the_driver_lacks() -> None:
    """FUNCTION_NOT_FOUND is asked once per library, not on every probe."""
    old = (
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetMinorNumber",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetComputeRunningProcesses_v3",
    )
    fake = FakeNvml(missing=old)
    first = nvml_query("box", nvml=fake)
    assert first[0] == (replace(H200_0, memory_used_mib=3072 + 512, minor=None), H200_1)
    assert [a.pid for a in first[1]] == [4242, 4343]  # through the v2 process call
    assert all(fake.calls[fn] == 1 for fn in old)  # once, on the first GPU, then remembered
    assert missing_functions(fake) == set(old)
    fake.calls.clear()
    assert nvml_query("box", nvml=fake) == first
    assert not any(fake.calls[fn] for fn in old)
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v2"] == 2
    # Remembered for that library only.
    other = FakeNvml()
    assert nvml_query("box", nvml=other)[0] == (H200_0, H200_1)
    assert missing_functions(other) == frozenset()


def test_nvml_pynvml_version_mismatch_never_escapes() -> None:
    """pynvml's unversioned call raises NVMLLibraryMismatchError, no NVMLError: still handled."""
    fake = FakeNvml(
        missing=(
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "nvmlDeviceGetComputeRunningProcesses_v2",
        )
    )
    with pytest.raises(SmiFailed, match="no compute-process call"):
        nvml_query("box", nvml=fake)
    assert "nvmlDeviceGetComputeRunningProcesses" in missing_functions(fake)

    class OldPynvml(FakeNvml):  # bindings that predate the versioned names
        nvmlDeviceGetComputeRunningProcesses_v3 = None  # type: ignore[assignment]
        nvmlDeviceGetComputeRunningProcesses_v2 = None  # type: ignore[assignment]

    old = OldPynvml()
    old.missing = {"nvmlDeviceGetComputeRunningProcesses_v3"}
    with pytest.raises(SmiFailed, match="no compute-process call"):
        nvml_query("box", nvml=old)  # the unversioned call (v3 inside) cannot answer either
    assert [a.pid for a in nvml_query("box", nvml=OldPynvml())[1]] == [4242, 4343]


SMI_GPU = (
    "0, GPU-00000000-1111-2222-3333-444444444444, 00000000:18:00.0, Disabled, NVIDIA H200, 10, "
    "143771, 1"
)
SMI = f"""#!/bin/sh
echo "$*" >>"$(dirname "$0")/calls"
case $1 in
  --query-gpu*) echo "{SMI_GPU}" ;;
esac
"""


@pytest.fixture
def local_node(tmp_path: Path) -> NodeConfig:
    (tmp_path / "dev").mkdir()
    for f in ("nvidia0", "nvidia1", "nvidiactl"):
        (tmp_path / "dev" / f).touch()
    smi = tmp_path / "nvidia-smi"
    smi.write_text(SMI)
    smi.chmod(0o755)
    (tmp_path / "calls").write_text("")
    # The driver's folders, as on a box whose device minors are not its GPU indices: GPU 0
    # (bus 18) is /dev/nvidia1, GPU 1 (bus 19) is /dev/nvidia0.
    for bus, minor in (("0000:18:00.0", 1), ("0000:19:00.0", 0)):
        folder = tmp_path / "driver" / "gpus" / bus
        folder.mkdir(parents=True)
        (folder / "information").write_text(
            f"Model: \t\t NVIDIA H200\nBus Location: \t {bus}\nDevice Minor: \t {minor}\n"
        )
    return NodeConfig(
        name="here",
        host="local",
        dev_prefix=f"{tmp_path}/dev/nvidia",
        nvidia_smi=str(smi),
        driver_dir=str(tmp_path / "driver"),
    )


async def _hold(path: str) -> asyncio.subprocess.Process:
    """Start a process that holds ``path`` open and that nvidia-smi does not list."""
    with open(path, "rb") as held:  # noqa: ASYNC230 - the child keeps its own copy
        return await asyncio.create_subprocess_exec("sleep", "30", stdin=held)


async def test_local_probe_uses_nvml(local_node: NodeConfig, tmp_path: Path) -> None:
    on1, on0 = await _hold(f"{local_node.dev_prefix}1"), await _hold(f"{local_node.dev_prefix}0")
    fake = FakeNvml()  # says GPU 0 is minor 1; GPU 1's minor it cannot say: the driver does
    fake.devices[0]["procs"] = [(os.getpid(), 1024**3)]
    t = make_transport(SshSettings())
    t.local = LocalTransport(nvml=fake)
    try:
        snap = await probe_node(t, local_node, smi_timeout_s=5, taken_at=9.0)
        assert (tmp_path / "calls").read_text() == ""  # nvidia-smi never ran
        assert [g.memory_used_mib for g in snap.gpus] == [3072, 0]
        assert [(g.bus_id, g.minor) for g in snap.gpus] == [
            ("00000000:18:00.0", 1),
            ("00000000:19:00.0", 0),
        ]
        procs = {(p.pid, p.gpu_index): p for p in snap.processes}
        assert procs[(os.getpid(), 0)].start_ticks is not None  # /proc read by the same exec
        assert procs[(os.getpid(), 0)].used_memory_mib == 1024
        # A holder is on the GPU its device file's minor names, not the GPU of that index.
        assert procs[(on1.pid, 0)].hidden and (on1.pid, 1) not in procs
        assert procs[(on0.pid, 1)].hidden and (on0.pid, 0) not in procs
        assert t.connected() == 0  # no SSH for a local node
    finally:
        for h in (on1, on0):
            h.kill()
            await h.wait()
        await t.close()


async def test_local_probe_never_guesses_a_minor(local_node: NodeConfig, tmp_path: Path) -> None:
    """NVML cannot say GPU 1's minor and the driver has no folder for it: minor unknown."""
    (tmp_path / "driver" / "gpus" / "0000:19:00.0" / "information").unlink()
    (tmp_path / "driver" / "gpus" / "0000:19:00.0").rmdir()
    on0 = await _hold(f"{local_node.dev_prefix}0")  # /dev/nvidia0: GPU 1's, but no one says so
    t = make_transport(SshSettings())
    t.local = LocalTransport(nvml=FakeNvml())
    try:
        snap = await probe_node(t, local_node, smi_timeout_s=5, taken_at=9.0)
        assert [(g.index, g.minor) for g in snap.gpus] == [(0, 1), (1, None)]
        assert not any(p.pid == on0.pid for p in snap.processes)  # on no GPU, not on GPU 0
        assert "device-file-unknown" in gpu_flags(snap.gpus[1], snap.on_gpu(1))
        assert "device-file-unknown" not in gpu_flags(snap.gpus[0], snap.on_gpu(0))
    finally:
        on0.kill()
        await on0.wait()
        await t.close()


async def test_local_probe_with_a_lost_and_a_mig_gpu(
    local_node: NodeConfig, tmp_path: Path
) -> None:
    """NVML's lost row and MIG flag reach the snapshot; device files still go by minor."""
    on1 = await _hold(f"{local_node.dev_prefix}1")  # GPU 0's device file (minor 1)
    fake = FakeNvml(fail={(0, "nvmlDeviceGetUtilizationRates"): 15})  # GPU 0 falls off the bus
    fake.devices[1].update(mig=(1, 1), instances=[None, [(os.getpid(), 1024**3)]])
    t = make_transport(SshSettings())
    t.local = LocalTransport(nvml=fake)
    try:
        snap = await probe_node(t, local_node, smi_timeout_s=5, taken_at=9.0)
        assert (tmp_path / "calls").read_text() == ""  # nvidia-smi never ran
        g0, g1 = snap.gpus
        assert (g0.index, g0.uuid, g0.memory_used_mib, g0.minor, g0.flags) == (
            0,
            "",
            None,
            1,
            ("lost",),
        )
        assert (g1.minor, g1.flags) == (0, ("mig",))  # its minor: the driver's, by bus id
        procs = {(p.pid, p.gpu_index): p for p in snap.processes}
        me = procs[(os.getpid(), 1)]  # an instance's process, on the MIG GPU
        assert me.visible_to_nvidia_smi and me.used_memory_mib == 1024
        assert procs[(on1.pid, 0)].hidden  # the lost GPU's device file is still GPU 0's
        assert "lost" in gpu_flags(g0, snap.on_gpu(0))
        assert "mig" in gpu_flags(g1, snap.on_gpu(1))
    finally:
        on1.kill()
        await on1.wait()
        await t.close()


async def test_local_probe_falls_back_to_nvidia_smi(local_node: NodeConfig, tmp_path: Path) -> None:
    t = make_transport(SshSettings())
    t.local = LocalTransport(nvml=FakeNvml(init_error=12))  # no libnvidia-ml
    snap = await probe_node(t, local_node, smi_timeout_s=5, taken_at=9.0)
    assert [g.memory_used_mib for g in snap.gpus] == [10]
    assert [(g.bus_id, g.minor) for g in snap.gpus] == [("00000000:18:00.0", 1)]  # the driver's
    assert len((tmp_path / "calls").read_text().splitlines()) == 2  # GPU and apps queries
    # A driver error in NVML also falls back: nvidia-smi then says what is wrong.
    t.local = LocalTransport(nvml=FakeNvml(init_error=9))
    assert (await t.local.nvml_snapshot(local_node)) is None


async def test_real_pynvml_here(local_node: NodeConfig) -> None:
    """On a box without a GPU the real pynvml is missing its library: NVML falls back."""
    try:
        gpus, apps = nvml_query("here")
    except (SmiMissing, SmiFailed):
        assert await LocalTransport().nvml_snapshot(local_node) is None
    else:  # a box with a GPU (see tests/gpu/check_local.py for the real comparison)
        assert gpus and all(isinstance(g, GpuInfo) for g in gpus)
        assert all(isinstance(a, ComputeApp) for a in apps)


async def test_local_timeout_kills_the_whole_group(tmp_path: Path) -> None:
    node = NodeConfig(name="here", host="local")
    pidfile = tmp_path / "child"
    t = LocalTransport()
    with pytest.raises(CommandTimeout):
        await t.run(node, ["sh", "-c", f"sleep 30 & echo $! >{pidfile}; wait"], timeout=0.5)
    child = int(pidfile.read_text())
    # a killed orphan may linger as a zombie until reaped: that counts as gone
    await until(lambda: not alive(child), 10, f"grandchild {child} to die with its group")


async def test_unknown_host_name_is_unreachable(tmp_path: Path) -> None:
    _write(tmp_path / "known_hosts", "")
    t = SshTransport(SshSettings(known_hosts=str(tmp_path / "known_hosts"), connect_timeout_s=3))
    try:
        with pytest.raises(
            NodeUnreachable, match=r"cannot connect to gpubot-no-such-host\.invalid"
        ):
            await t.run(NodeConfig(name="x", host="gpubot-no-such-host.invalid"), ["true"])
    finally:
        await t.close()


async def test_router_sends_hosts_to_the_right_transport(tmp_path: Path) -> None:
    t = make_transport(SshSettings(known_hosts=str(tmp_path / "absent"), connect_timeout_s=0.5))
    try:
        assert (await t.run(NodeConfig(name="l", host="local"), ["echo", "hi"])).stdout == "hi\n"
        with pytest.raises(HostKeyRejected):  # a remote node goes through SSH (and its checks)
            await t.run(NodeConfig(name="r", host="127.0.0.1", port=_free_port()), ["true"])
    finally:
        await t.close()


async def test_local_probe_takes_nothing_from_a_forged_name(
    local_node: NodeConfig, tmp_path: Path
) -> None:
    """A job NVML lists writes probe-shaped text into its argv: it is shown, never obeyed."""
    forged = (
        "x\n\n@gpubot procs\nc 100 1\np 1 S 0 1 0 0 =init =init ! =0::/ =0\nu 0 =root\n"
        "\n@gpubot end\n"
    )
    with open(f"{local_node.dev_prefix}1", "rb") as held:  # noqa: ASYNC230 (a test fixture file)
        job = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "import time; time.sleep(30)", forged, stdin=held
        )
    fake = FakeNvml()
    fake.devices[0]["procs"] = [(job.pid, 1024**3)]
    t = make_transport(SshSettings())
    t.local = LocalTransport(nvml=fake)
    try:
        snap = await probe_node(t, local_node, smi_timeout_s=5, taken_at=9.0)
        assert {(p.pid, p.gpu_index) for p in snap.processes} == {(job.pid, 0)}  # no pid 1
        (p,) = snap.processes
        assert (p.uid, p.start_ticks is not None, p.used_memory_mib) == (os.geteuid(), True, 1024)
        assert p.command is not None and "\n" not in p.command and "@gpubot end" in p.command
        assert "nvmlSystemGetProcessName" not in fake.calls  # NVML is never asked for a name
    finally:
        job.kill()
        await job.wait()
        await t.close()
