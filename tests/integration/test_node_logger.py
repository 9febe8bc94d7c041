"""Attribution on the node (issue 37): each action writes one ``logger -t gpubot`` line there.

On the simulated fleet: a reset's signals, a workload stop (the sim's docker stand-in, in real
cgroups) and a ``gpu-reset`` each leave their line in the node's journal, read back through the
node itself (``journalctl -t gpubot`` over SSH, the node's stand-in: ``gpusim.kernlog``). The
controls: a node whose ``logger`` fails (no syslog socket) or hangs still completes the action,
and its audit record says what logger said.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpubot.config import Settings
from gpubot.core.doctor.node import LOGGER_TEST, doctor_argv, node_checks, parse_facts
from gpubot.core.models import Outcome
from gpubot.core.reset.plan import ResetRequest
from gpubot.services.reset import Ask, NodeLocks, ResetResult, ResetService
from gpubot.services.status import StatusService
from gpubot.store import Store
from gpubot.transport import make_transport
from gpusim.fleet import SimFleet, SimNode
from gpusim.kernlog import NO_SOCKET
from tests.fixtures.fleet import reset_fixtures
from tests.procs import alive


@pytest.fixture(scope="module")
def fleet(
    cgroups_ok: None, sim_users: tuple[str, ...], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SimFleet]:
    with SimFleet(
        tmp_path_factory.mktemp("node-logger"), nodes=1, gpus=4, runtimes=True, release_delay_s=0.2
    ) as f:
        yield f


settings, store, engine = reset_fixtures(grace_s=1.0, verify_timeout_s=4.0)[:3]


@pytest.fixture
def node(fleet: SimFleet) -> Iterator[SimNode]:
    n = fleet.node("node1")
    yield n
    n.clear()  # kills what the test left by pid, its cgroups, and empties the node's logs


async def journal(engine: ResetService) -> list[str]:
    """Return gpubot's lines as the node's own ``journalctl -t gpubot`` prints them."""
    node = engine.status.node("node1")
    res = await engine.transport.run(node, ["journalctl", "-t", "gpubot", "-o", "short-iso"])
    assert res.exit_status == 0, res.stderr
    return [x.split(" gpubot: ", 1)[1] for x in res.stdout.splitlines() if " gpubot: " in x]


async def audited(store: Store, result: ResetResult) -> list[dict[str, Any]]:
    """Return what logger said of each line in the action's audit record: ``node_log`` events
    (a gpu-reset's, a stop's) and the ``node_log`` a signal exec's first step carries."""
    assert result.action_id is not None
    detail = await store.action(result.action_id)
    assert detail is not None
    doc = json.loads(json.dumps(detail.as_dict(), default=str))
    return [
        e if e.get("kind") == "node_log" else e["node_log"]
        for e in doc["events"]
        if e.get("kind") == "node_log" or "node_log" in e
    ]


async def test_a_reset_writes_one_line_per_signal_with_who_and_the_audit_number(
    engine: ResetService, store: Store, node: SimNode, sim_users: tuple[str, ...]
) -> None:
    alice = sim_users[0]
    hostile = 'x" by "root", audit #999\n'  # a name chosen to forge a line
    w = node.spawn(gpu=2, mib=2048, behaviour="stubborn", user=alice, name=hostile)
    plan, before = await engine.plan(ResetRequest("node1", "root", gpus=(2,)))
    ask = Ask.by("U0BOB", "test", "/gpu reset node1 2")
    result = await engine.execute(plan, ask, before=before, approval=approval())
    assert [g.outcome for g in result.gpus] == [Outcome.FREED] and not alive(w.pid)
    n = result.action_id
    lines = await journal(engine)
    assert len(lines) == 2, lines  # SIGTERM, then SIGKILL after the grace: one line each
    for sig, got in zip(("SIGTERM", "SIGKILL"), lines, strict=True):
        assert got.startswith(f"reset node1 gpu 2: {sig} pid {w.pid} (")
        assert got.endswith(
            f' by "U0BOB", requested by "alice", approved by "olga", request #7, audit #{n}'
        )
        assert f'"{alice}"' in got
        # the forged words arrive quoted and escaped (the probe already wrote the newline as
        # the text \x0a, so its backslash is escaped): one line, never gpubot's own
        assert '"x\\" by \\"root\\", audit #999\\\\x0a ' in got and "\n" not in got
    events = await audited(store, result)
    assert [(e["line"], e["ok"], e["exit_status"]) for e in events] == [(x, True, 0) for x in lines]


def approval() -> dict[str, Any]:
    """An approval record as ``approvals.approval_record`` writes it."""
    return {
        "id": 7,
        "requester": "U0ALICE",
        "requester_name": "alice",
        "approver": "U0OLGA",
        "approver_name": "olga",
    }


async def test_a_gpu_reset_writes_its_line(
    engine: ResetService, store: Store, node: SimNode
) -> None:
    leak = node.spawn(gpu=1, mib=6000, behaviour="orphan")
    os.kill(leak.pid, signal.SIGKILL)  # started by this test: its memory stays, orphaned
    result = await engine.gpu_reset("node1", 1, Ask.by("U0CAROL", "test", "/gpu gpu-reset"))
    assert [g.outcome for g in result.gpus] == [Outcome.FREED]
    want = (
        "gpu-reset node1 gpu 1: GPU reset (nvidia-smi --gpu-reset -i 1) "
        f'by "U0CAROL", audit #{result.action_id}'
    )
    assert await journal(engine) == [want]
    (event,) = await audited(store, result)
    assert (event["line"], event["ok"]) == (want, True)
    steps = [str(s.kind) for s in result.steps]
    assert steps.index("node_log") < steps.index("gpu_reset")  # its words are nvidia-smi's only
    (reset,) = [s.data for s in result.steps if s.kind == "gpu_reset"]
    assert "logger" not in reset["output"] and "was successfully reset" in reset["output"]


async def test_a_workload_stop_writes_its_line(
    settings: Settings, store: Store, node: SimNode
) -> None:
    s = dataclasses.replace(
        settings, reset=dataclasses.replace(settings.reset, stop_workloads=True)
    )
    transport = make_transport(s.ssh)
    try:
        eng = ResetService(s, transport, store, StatusService(s, transport, store), NodeLocks())
        node.spawn(gpu=3, mib=2500, cgroup="docker", container_name="trainer", restart="always")
        plan, before = await eng.plan(ResetRequest("node1", "root", gpus=(3,)))
        result = await eng.execute(plan, Ask.by("U0DAN", "test", "t"), before=before)
        lines = await journal(eng)
    finally:
        await transport.close()
    assert [g.outcome for g in result.gpus] == [Outcome.FREED]
    n = result.action_id
    stops = [x for x in lines if ": stop " in x]
    assert stops == [
        f'reset node1 gpu 3: stop docker "trainer" ("docker stop trainer") by "U0DAN", audit #{n}'
    ]
    assert all(x.endswith(f"audit #{n}") for x in lines)  # the signals' lines too
    events = await audited(store, result)
    assert stops[0] in [e["line"] for e in events] and all(e["ok"] for e in events)


async def test_a_failing_logger_changes_nothing_and_is_audited(
    engine: ResetService, store: Store, node: SimNode
) -> None:
    node.kernel.set_logger_mode("no-socket")
    w = node.spawn(gpu=0, mib=2048, behaviour="normal")
    plan, before = await engine.plan(ResetRequest("node1", "root", gpus=(0,)))
    result = await engine.execute(plan, Ask.by("U0BOB", "test", "t"), before=before)
    assert [g.outcome for g in result.gpus] == [Outcome.FREED] and not alive(w.pid)
    assert [(s.data["pid"], s.data["result"]) for s in result.steps if s.kind == "signal"] == [
        (w.pid, "sent")
    ]
    assert await journal(engine) == []  # nothing reached the journal
    (event,) = await audited(store, result)
    assert (event["ok"], event["exit_status"], event["said"]) == (False, 1, NO_SOCKET)
    assert event["line"].startswith(f"reset node1 gpu 0: SIGTERM pid {w.pid} ")


async def test_a_hanging_logger_is_cut_and_the_gpu_reset_still_runs(
    engine: ResetService, store: Store, node: SimNode
) -> None:
    node.kernel.set_logger_mode("hang")
    leak = node.spawn(gpu=1, mib=6000, behaviour="orphan")
    os.kill(leak.pid, signal.SIGKILL)  # started by this test: its memory stays, orphaned
    t0 = time.monotonic()
    result = await engine.gpu_reset("node1", 1, Ask.by("U0CAROL", "test", "t"))
    assert [g.outcome for g in result.gpus] == [Outcome.FREED]
    assert time.monotonic() - t0 < 30  # cut after LOGGER_TIMEOUT_S, not logger's own 60 s
    (event,) = await audited(store, result)
    assert (event["ok"], event["exit_status"]) == (False, 124)  # timeout(1)'s status


@pytest.mark.parametrize("mode", ["journal", "no-socket"])
async def test_the_doctor_writes_a_test_line_and_names_a_node_that_logs_nothing(
    engine: ResetService, node: SimNode, mode: str
) -> None:
    node.kernel.set_logger_mode(mode)
    cfg = engine.status.node("node1")
    res = await engine.transport.run(cfg, doctor_argv(cfg, timeout_s=5))
    (check,) = [c for c in node_checks(cfg, parse_facts(res.stdout)) if c.name == "node log"]
    if mode == "journal":
        assert check.ok and await journal(engine) == [LOGGER_TEST]
    else:
        assert not check.ok and await journal(engine) == []
        assert check.detail == f"logger exit 1: {NO_SOCKET}" and "on node1" in check.fix
