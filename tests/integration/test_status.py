"""Status service against the simulated fleet over both SSH servers: fields, faults, big fleets."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import pwd
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import pytest

from gpubot.config import Settings, load
from gpubot.core.models import CommandResult, NodeConfig
from gpubot.services.status import StatusService
from gpubot.transport import make_transport
from gpusim.fleet import SimFleet


def _settings(fleet: SimFleet, command_timeout_s: float = 12.0) -> Settings:
    # Generous: the timeouts themselves are not under test here, and CI machines can be slow.
    s = load(fleet.config_path)
    ssh = dataclasses.replace(s.ssh, command_timeout_s=command_timeout_s, connect_timeout_s=3.0)
    return dataclasses.replace(s, ssh=ssh)


@pytest.fixture(scope="module", params=["asyncssh", "sshd"])
def fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SimFleet]:
    with SimFleet(tmp_path_factory.mktemp("status"), nodes=3, gpus=4, server=request.param) as f:
        yield f


@pytest.fixture
async def status(fleet: SimFleet) -> AsyncIterator[StatusService]:
    settings = _settings(fleet)
    transport = make_transport(settings.ssh)
    yield StatusService(settings, transport)
    await transport.close()
    for n in fleet.nodes:
        n.set_fault(None)


def _ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


async def test_every_field_matches_the_sims_own_state(
    fleet: SimFleet, status: StatusService, sim_users: tuple[str, ...]
) -> None:
    node = fleet.node("node1")
    alice = node.spawn(gpu=1, mib=4096, user=sim_users[0], util_pct=40)
    mine = node.spawn(gpu=1, mib=1024)
    hidden = node.spawn(gpu=2, mib=2048, behaviour="hidden")
    ctl = node.spawn(gpu=None, behaviour="ctl-only")
    try:
        snap = await status.snapshot(status.node("node1"))
        state = node.state()
        assert [g.index for g in snap.gpus] == [g["index"] for g in state["gpus"]]
        for g, sg in zip(snap.gpus, state["gpus"], strict=True):
            assert (g.uuid, g.name) == (sg["uuid"], sg["name"])
            assert (g.memory_used_mib, g.memory_total_mib) == (
                sg["memory_used_mib"],
                sg["memory_total_mib"],
            )
            assert g.utilization_pct == sg["utilization_pct"]
        procs = {p.pid: p for p in snap.processes}
        a = procs[alice.pid]
        assert (a.gpu_index, a.used_memory_mib, a.user) == (1, 4096, sim_users[0])
        assert a.start_ticks == _ticks(alice.pid) == alice.start_ticks
        assert a.visible_to_nvidia_smi and a.holds_device_file and a.state in {"S", "R"}
        assert a.ppid == os.getpid() or a.ppid is not None
        assert procs[mine.pid].user == pwd.getpwuid(os.getuid()).pw_name
        h = procs[hidden.pid]
        assert h.gpu_index == 2 and h.hidden and h.used_memory_mib is None
        assert snap.gpu(2) is not None and snap.gpu(2).memory_used_mib == 2048  # type: ignore[union-attr]
        assert ctl.pid not in procs
        assert ctl.pid in {p.pid for p in snap.ctl_only}
    finally:
        for w in (alice, mine, hidden, ctl):
            os.kill(w.pid, 9)


@pytest.mark.parametrize(
    ("fault", "words"),
    [
        ("missing", "nvidia-smi"),
        ("driver-error", "couldn't communicate with the NVIDIA driver"),
        ("garbled", "cannot parse"),
        ("hang", "hung"),
    ],
)
async def test_each_fault_fails_only_its_node(fleet: SimFleet, fault: str, words: str) -> None:
    settings = _settings(fleet, command_timeout_s=8.0)  # a hung nvidia-smi is cut after 3 s
    transport = make_transport(settings.ssh)
    fleet.node("node2").set_fault(fault)
    try:
        result = await StatusService(settings, transport).fleet(["all"])
    finally:
        fleet.node("node2").set_fault(None)
        await transport.close()
    assert [s.node for s in result.snapshots] == ["node1", "node3"]
    assert list(result.failed) == ["node2"]
    assert words in result.failed["node2"], result.failed["node2"]


async def test_a_slow_nvidia_smi_still_answers(fleet: SimFleet, status: StatusService) -> None:
    fleet.node("node3").set_fault("slow", delay_s=0.5)
    result = await status.fleet(["node3"])
    assert result.ok and result.seconds >= 0.5


async def test_groups_and_unknown_names(status: StatusService) -> None:
    assert [n.name for n in status.resolve(["odd"])] == ["node1", "node3"]
    with pytest.raises(Exception, match="unknown node or group 'nodeX'"):
        status.resolve(["nodeX"])


async def test_fleet_of_32_with_some_down(fleet_factory: Callable[..., SimFleet]) -> None:
    big = fleet_factory(nodes=32, gpus=2)
    down = {"node3", "node10", "node17", "node31"}
    for name in down:
        big.node(name).stop_server()
    big.node("node20").hang_server()  # accepts TCP, never speaks SSH
    big.node("node5").spawn(gpu=1, mib=777)
    settings = _settings(big)
    transport = make_transport(settings.ssh)
    try:
        result = await StatusService(settings, transport).fleet(["all"])
    finally:
        await transport.close()
    assert set(result.failed) == down | {"node20"}
    assert len(result.snapshots) == 27
    assert all("refused" in result.failed[n] or "unreachable" in result.failed[n] for n in down)
    assert "no SSH answer" in result.failed["node20"], result.failed["node20"]
    node5 = next(s for s in result.snapshots if s.node == "node5")
    assert node5.gpu(1).memory_used_mib == 777  # type: ignore[union-attr]


async def test_identical_requests_in_flight_share_one_probe(fleet: SimFleet) -> None:
    settings = _settings(fleet)
    transport = make_transport(settings.ssh)
    runs: list[str] = []
    real_run = transport.run

    async def counting_run(node: NodeConfig, argv: Sequence[str], **kw: Any) -> CommandResult:
        runs.append(node.name)
        return await real_run(node, argv, **kw)

    transport.run = counting_run  # type: ignore[method-assign]
    status = StatusService(settings, transport)
    try:
        burst = await asyncio.gather(*(status.fleet(["all"]) for _ in range(5)))
        assert all(r.ok and len(r.snapshots) == 3 for r in burst)
        assert sorted(runs) == ["node1", "node2", "node3"]  # one probe per node, not five
        await status.fleet(["all"])  # the next request, after the burst, probes again
        assert len(runs) == 6
    finally:
        await transport.close()
