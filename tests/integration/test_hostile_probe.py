"""A hostile user on a node against the probe itself (issue 21): blinding it, stalling it.

``gpusim-alice`` (no root, no sudo) starts a setuid program through a link named ``nvidia-smi``
with gpubot's nvidia-smi path as argv[0], and lets it age past the probe's limit: the probe must
not take it for one of its own stuck queries. Nor may another nvidia-smi of gpubot's own account
(``dmon``, ``-l 5``). She then starts 200 processes that hold only ``nvidiactl``/``nvidia-uvm``
with 4 KiB of non-ASCII argv each: status must answer within its limit, her own GPU job must stay
resettable, and nothing of a probe gpubot gave up on may be left running on the node.

Each defence has a control: the probe script with the defence's lines textually replaced by the
old ones (``hostile_scripts``) lets the attack through.
"""

from __future__ import annotations

import asyncio
import gc
import os
import pwd
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpubot.config import Settings
from gpubot.core.models import NodeConfig, Outcome
from gpubot.core.probe.snapshot import parse_probe, probe_argv
from gpubot.core.reset.plan import ResetRequest
from gpubot.errors import CommandTimeout, ProbeError, SmiFailed
from gpubot.services.reset import Ask, ResetService
from gpubot.transport import SshTransport, ssh
from gpusim.fleet import SimFleet, SimNode
from tests.fixtures.fleet import reset_fixtures
from tests.integration.hostile_scripts import (
    OLD_OWN_QUERY,
    Holders,
    fake_smi,
    old_script,
    probe_processes,
    setuid_folder,
)
from tests.procs import alive, until, wait_until

T = 1.5  # each query's limit: a copy of ours older than 2 × 1 + 2 = 4 s is stuck
LIM_S = 4.5


@pytest.fixture(scope="module")
def fleet(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    sim_users: tuple[str, ...],
) -> Iterator[SimFleet]:
    """``root``: asyncssh, logged in as root; ``view``: as gpusim-bob; ``sshd``: OpenSSH, root."""
    kind = getattr(request, "param", "root")
    opts: dict[str, Any] = {"server": "sshd"} if kind == "sshd" else {}
    if kind == "view":
        opts["view_user"] = sim_users[1]
    with SimFleet(
        tmp_path_factory.mktemp(f"hostile-probe-{kind}"),
        nodes=1,
        gpus=2,
        release_delay_s=0.3,
        **opts,
    ) as f:
        yield f


settings, store, engine, node = reset_fixtures()


def login(fleet: SimFleet) -> str:
    """Return the account gpubot's SSH sessions on ``fleet`` run as."""
    return fleet.user


async def probe_with(settings: Settings, script: str | None = None, **kw: Any) -> Any:
    """Probe node1 (with ``script`` instead of the probe's own, a control); return its snapshot."""
    cfg = settings.node("node1")
    assert cfg is not None
    timeout = kw.pop("timeout", settings.ssh.command_timeout_s)
    transport = SshTransport(settings.ssh)
    kw.setdefault("budget_s", timeout - 1)  # as the status service's: its queries' and a second
    try:
        argv = probe_argv(cfg, smi_timeout_s=T, **kw)
        argv[2] = script or argv[2]
        return parse_probe(cfg, await transport.run(cfg, argv, timeout=timeout), 1.0)
    finally:
        await transport.close()


def aged(pids: list[int]) -> None:
    """Wait until every process is older than the probe's limit for a query of its own."""
    wait_until(lambda: all(age_s(p) > LIM_S for p in pids), 30, "the fakes to age")


def age_s(pid: int) -> float:
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    return float(Path("/proc/uptime").read_text().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")


# ---- 1. blinding the node with a fake stuck nvidia-smi -----------------------------------------


@pytest.mark.parametrize("fleet", ["root", "view"], indirect=True)
async def test_a_setuid_program_named_nvidia_smi_never_blinds_the_node(
    settings: Settings, fleet: SimFleet, node: SimNode, sim_users: tuple[str, ...]
) -> None:
    # A setuid-root program, and one of gpubot's own login account (the only kind the old check
    # took for ours on a non-root login): alice runs both, argv[0] gpubot's nvidia-smi path.
    alice, me = sim_users[0], login(fleet)
    with setuid_folder() as folder:
        fakes = {
            owner: fake_smi(folder, owner, alice, [node.nvidia_smi, "600"])
            for owner in dict.fromkeys(["root", me])
        }
        try:
            for owner, p in fakes.items():
                status = Path(f"/proc/{p.pid}/status").read_text()
                uids = next(ln for ln in status.splitlines() if ln.startswith("Uid:")).split()[1:]
                assert uids[:3] == [
                    str(pwd.getpwnam(alice).pw_uid),
                    *[str(pwd.getpwnam(owner).pw_uid)] * 2,
                ]
            aged([p.pid for p in fakes.values()])
            snap = await probe_with(settings)
            assert len(snap.gpus) == 2 and all(alive(p.pid) for p in fakes.values())
            # Control: the old check (effective uid, "$smi" anywhere in argv) is blinded.
            with pytest.raises(SmiFailed, match=rf"driver hung: nvidia-smi pid {fakes[me].pid} "):
                await probe_with(settings, old_script(own_query=OLD_OWN_QUERY))
        finally:
            for p in fakes.values():
                p.kill()
                p.wait()


@pytest.mark.parametrize("fleet", ["root", "view"], indirect=True)
@pytest.mark.parametrize("args", [["dmon"], ["-l", "5"]], ids=["dmon", "loop"])
async def test_another_nvidia_smi_of_gpubots_own_account_never_blinds_the_node(
    settings: Settings, fleet: SimFleet, node: SimNode, args: list[str]
) -> None:
    # An admin's `nvidia-smi dmon` or `nvidia-smi -l 5` under gpubot's own account: all uids the
    # probe's, argv[0] its nvidia-smi path, but not one of its queries. (A link to bash named
    # nvidia-smi runs a script named like the argument, which waits on its stdin.)
    with setuid_folder() as folder:
        (folder / args[-1]).write_text("read -r _\n")
        (folder / args[-1]).chmod(0o644)
        (folder / "nvidia-smi").symlink_to("/bin/bash")
        p = subprocess.Popen(
            [node.nvidia_smi, *args],
            executable=folder / "nvidia-smi",
            cwd=folder,
            user=login(fleet),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            aged([p.pid])
            assert Path(f"/proc/{p.pid}/comm").read_text() == "nvidia-smi\n" and alive(p.pid)
            snap = await probe_with(settings)
            assert len(snap.gpus) == 2
            with pytest.raises(SmiFailed, match=rf"driver hung: nvidia-smi pid {p.pid} "):
                await probe_with(settings, old_script(own_query=OLD_OWN_QUERY))  # the control
        finally:
            p.kill()
            p.wait()
            assert p.stdin is not None
            p.stdin.close()


@pytest.mark.parametrize("fleet", ["root", "view"], indirect=True)
async def test_a_real_stuck_query_of_gpubots_own_is_still_reported(
    settings: Settings, node: SimNode
) -> None:
    node.set_fault("stuck", hold_s=60)
    with pytest.raises((SmiFailed, CommandTimeout)):  # the query hangs, and one copy stays
        await probe_with(settings)
    wait_until(lambda: len(node.stuck_smi()) == 1, 10, "the stuck copy")
    ((pid, _),) = node.stuck_smi()
    aged([pid])
    with pytest.raises(SmiFailed, match=rf"driver hung: nvidia-smi pid {pid} stuck for \d+s"):
        await probe_with(settings)
    assert node.hung_smi() == []  # no new query started


# ---- 2. stalling the probe ---------------------------------------------------------------------

N_HOLDERS = 200


@pytest.fixture
def holders(node: SimNode, sim_users: tuple[str, ...]) -> Iterator[Holders]:
    """200 processes of alice's that hold only nvidiactl and nvidia-uvm, 4 KiB of non-ASCII
    argv each (``sleep`` started with that argv[0]: 200 of them start in about a second)."""
    with Holders(node.dev_prefix, sim_users[0], N_HOLDERS) as h:
        yield h


async def test_200_ctl_only_holders_cost_the_probe_nothing(
    settings: Settings,
    engine: ResetService,
    node: SimNode,
    holders: Holders,
    sim_users: tuple[str, ...],
) -> None:
    job = node.spawn(gpu=0, mib=30000, user=sim_users[0])  # alice's own 30 GB job
    limit = settings.ssh.command_timeout_s
    t = time.monotonic()
    snap = await engine.status.snapshot(engine.status.node("node1"))
    took = time.monotonic() - t
    assert took < limit, f"status took {took:.1f}s, over its {limit:g}s limit"
    assert {h.pid for h in snap.ctl_only} >= set(holders.pids)  # counted, never read
    assert [(p.pid, p.user) for p in snap.processes] == [(job.pid, sim_users[0])]
    assert probe_processes(node) == []
    # A forced reset of her own job: root asks, every kill is forced; the holders are no targets.
    plan, before = await engine.plan(ResetRequest("node1", "root", gpus=(0,)))
    assert [(t.pid, t.forced) for t in plan.targets] == [(job.pid, True)]
    result = await engine.execute(plan, Ask.by("test", "test", "test"), before=before)
    assert [g.outcome for g in result.gpus] == [Outcome.FREED] and not alive(job.pid)
    assert all(alive(pid) for pid in holders.pids)


async def test_the_old_path_stalls_on_200_ctl_only_holders_and_is_left_running_nowhere(
    settings: Settings, node: SimNode, holders: Holders
) -> None:
    # Control: /proc read for every holder, escaped byte by byte, no budget: no answer in 5 s,
    # where the defended probe says "unknown" within its 2 s budget (the test below). On an idle
    # box the old path takes about 9.5 s for 200 holders since queries are read in blocks, and
    # it grows with them: past the transport's 15 s at about 320, which a user can start.
    t = time.monotonic()
    with pytest.raises(CommandTimeout):
        await probe_with(
            settings, old_script(escaping=True, reading=True), budget_s=1000, timeout=5
        )
    assert time.monotonic() - t < 15
    await until(lambda: probe_processes(node) == [], 10, "the abandoned probe to end")


async def test_past_its_budget_the_probe_says_unknown_not_timeout(
    settings: Settings, node: SimNode, holders: Holders
) -> None:
    # The old reading and escaping path, but the new budget (2 s): the node's answer is unknown,
    # in one line, well before the transport's limit; never a timeout, never "no holders". (On a
    # box far busier than its cores the budget may already run out in fuser's table.)
    t = time.monotonic()
    budget = r"time budget \(2s\) while reading (/proc|fuser's table): .* unknown"
    with pytest.raises(ProbeError, match=budget):
        await probe_with(settings, old_script(escaping=True, reading=True), budget_s=2)
    assert time.monotonic() - t < settings.ssh.command_timeout_s
    assert probe_processes(node) == []


@pytest.mark.parametrize("fleet", ["root", "sshd"], indirect=True)
async def test_a_probe_given_up_on_leaves_nothing_running(
    settings: Settings, node: SimNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    # nvidia-smi answers after 30 s; gpubot gives up after 8 (time enough for OpenSSH's session
    # to start on a box far busier than its cores): the remote bash, its query's subshell and
    # nvidia-smi itself must all be gone, by PID and start time.
    node.set_fault("slow", delay_s=30)
    cfg = settings.node("node1")
    assert cfg is not None
    for abandon in (True, False):
        if not abandon:  # the control: a transport that gives up and only walks away
            monkeypatch.setattr(ssh, "_abandon", lambda proc: None)
        transport = SshTransport(settings.ssh)  # a pool, open while we look (as the bot's is)
        seen: list[tuple[int, int]] = []
        watcher = asyncio.ensure_future(_watch(node, seen))
        try:
            with pytest.raises(CommandTimeout):
                await transport.run(cfg, probe_argv(cfg, smi_timeout_s=20), timeout=8.0)
            watcher.cancel()
            assert len(seen) >= 2, seen  # bash and nvidia-smi at least
            gone = await asyncio.to_thread(_wait_gone, seen, 5.0)
            assert gone == abandon, f"left running: {probe_processes(node)}"
        finally:
            watcher.cancel()
            _kill(seen)
            await transport.close()


async def _watch(node: SimNode, seen: list[tuple[int, int]]) -> None:
    while True:
        seen.extend(p for p in await asyncio.to_thread(probe_processes, node) if p not in seen)
        await asyncio.sleep(0.05)


def _wait_gone(procs: list[tuple[int, int]], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(_same(pid, ticks) for pid, ticks in procs):
            return True
        time.sleep(0.05)
    return False


def _same(pid: int, ticks: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[19]) == ticks and fields[0] not in ("Z", "X")


def _kill(procs: list[tuple[int, int]]) -> None:
    """Kill what a control left running (processes this test's probe started), by PID."""
    for pid, ticks in procs:
        if _same(pid, ticks):
            os.kill(pid, 9)
    assert _wait_gone(procs, 5.0)


# ---- the transport's output cap ---------------------------------------------------------------


@pytest.mark.parametrize("fleet", ["root", "sshd"], indirect=True)
async def test_output_past_the_cap_is_one_line_and_never_read(settings: Settings) -> None:
    cfg = settings.node("node1")
    assert cfg is not None
    argv = ["bash", "-c", "printf '%0300000d' 0; sleep 30", "gpubot-flood"]
    capped = SshTransport(settings.ssh, max_output_bytes=64 * 1024)
    plain = SshTransport(settings.ssh)  # the control: no smaller cap, all of it is read
    try:
        t = time.monotonic()
        with pytest.raises(ProbeError, match=r"gpubot-flood printed more than 64 KiB: not read"):
            await capped.run(cfg, argv, timeout=20)
        assert time.monotonic() - t < 10  # abandoned at the cap, not at the end
        r = await plain.run(cfg, ["bash", "-c", "printf '%0300000d' 0"], timeout=20)
        assert len(r.stdout) == 300000
    finally:
        await capped.close()
        await plain.close()


async def test_local_output_past_the_cap_is_one_line_and_killed() -> None:
    from gpubot.transport import LocalTransport

    cfg = NodeConfig(name="here", host="local")
    argv = ["bash", "-c", "printf '%0300000d' 0; exec sleep 30", "gpubot-flood"]
    t = time.monotonic()
    with pytest.raises(ProbeError, match=r"gpubot-flood printed more than 64 KiB: not read"):
        await LocalTransport(max_output_bytes=64 * 1024).run(cfg, argv, timeout=20)
    assert time.monotonic() - t < 10
    r = await LocalTransport().run(cfg, ["bash", "-c", "printf '%0300000d' 0"], timeout=20)
    assert len(r.stdout) == 300000
    # Nothing of the capped command is left open: a pipe left short of its end would be an
    # unclosed transport when collected (a ResourceWarning, an error here), in whichever later
    # test the collector happens to run.
    gc.collect()
