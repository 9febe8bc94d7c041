"""Services over the fast seams: the scripted transport and the memory store, in milliseconds.

The nodes answer with what the simulated fleet answered gpubot's real probe (recorded verbatim
by ``tests/fixtures/record_probe.py`` into ``tests/fixtures/probe_outputs/``): an idle node of 2
GPUs, and the same node with two users' jobs on GPU 1. Nothing is started: no SSH server, no
process, no database file. The slow tests (``tests/integration``) run the same services
against real processes; these show their behaviour fast.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from gpubot.config import Settings
from gpubot.core.models import CommandResult
from gpubot.core.reset.plan import ResetRequest
from gpubot.errors import CommandTimeout, NodeUnreachable, UsageError
from gpubot.services.reset import ResetService
from gpubot.services.status import StatusService
from gpubot.store import Store, open_store
from gpubot.transport import ScriptedTransport
from gpubot.transport.scripted import Call, answer
from tests.fixtures.recorded import recorded, settings

ALICE, BOB = "gpusim-alice", "gpusim-bob"


@pytest.fixture
def store() -> Iterator[Store]:
    s = open_store("memory://")
    try:
        yield s
    finally:
        s.close()


def busy() -> tuple[Settings, ScriptedTransport]:
    prefix, probe = recorded("sim-two-users-gpu1")
    return settings(prefix), ScriptedTransport(answer({"gpubot-probe": probe}))


async def test_status_reads_the_recorded_node_and_audits_the_query(store: Store) -> None:
    cfg, transport = busy()
    status = await StatusService(cfg, transport, store).fleet(["node1"], actor="U0ALICE")
    assert status.ok and [s.node for s in status.snapshots] == ["node1"]
    (snap,) = status.snapshots
    assert [(g.index, g.memory_used_mib) for g in snap.gpus] == [(0, 0), (1, 6144)]
    on_gpu1 = {p.user: p.used_memory_mib for p in snap.on_gpu(1)}
    assert on_gpu1 == {ALICE: 4096, BOB: 2048} and snap.on_gpu(0) == ()
    assert transport.programs() == ["gpubot-probe"]  # one exec per node
    (query,) = await store.queries()
    assert (query.actor, query.node) == ("U0ALICE", "node1")
    assert json.loads(query.payload)["query"] == "status" and (await store.verify()).ok


async def test_each_node_fails_alone_in_its_own_words(store: Store) -> None:
    prefix, probe = recorded("sim-idle")

    def handler(call: Call) -> CommandResult:
        if call.node.name == "node2":
            raise NodeUnreachable("node2", "cannot connect to node2.lab:22: Connection refused")
        return answer({"gpubot-probe": probe})(call)

    status = await StatusService(settings(prefix), ScriptedTransport(handler), store).fleet()
    assert [s.node for s in status.snapshots] == ["node1"]
    assert status.snapshots[0].processes == ()  # idle
    assert status.failed == {"node2": "cannot connect to node2.lab:22: Connection refused"}


async def test_a_probe_that_times_out_is_named_as_timed_out(store: Store) -> None:
    prefix, _ = recorded("sim-idle")
    late = CommandTimeout("node1", "gpubot-probe: no answer in 30s (abandoned)")
    transport = ScriptedTransport(answer({"gpubot-probe": late}))
    status = await StatusService(settings(prefix), transport, store).fleet(["node1"])
    assert status.timed_out == ("node1",) and "no answer in 30s" in status.failed["node1"]


async def test_reset_planning_forces_only_what_is_not_the_requesters(store: Store) -> None:
    cfg, transport = busy()
    status = StatusService(cfg, transport, store)
    reset = ResetService(cfg, transport, store, status)
    plan, snap = await reset.plan(ResetRequest(node="node1", requester=ALICE, gpus=(1,)))
    assert plan.gpus == (1,) and plan.requester == ALICE
    by_user = {t.user: t for t in plan.targets}
    assert set(by_user) == {ALICE, BOB} and plan.forced
    assert not by_user[ALICE].forced and by_user[BOB].forced  # bob's job is not alice's to stop
    assert {t.pid: t.start_ticks for t in plan.targets} == {
        p.pid: p.start_ticks for p in snap.on_gpu(1)
    }  # each target carries its identity, re-checked with every signal
    assert plan.memory_before_mib == {1: 6144}
    assert transport.programs() == ["gpubot-probe"]  # planning signals nothing
    assert await store.actions() == []  # and writes no action


async def test_reset_planning_of_one_users_processes(store: Store) -> None:
    cfg, transport = busy()
    reset = ResetService(cfg, transport, store, StatusService(cfg, transport, store))
    plan, _ = await reset.plan(ResetRequest(node="node1", requester=BOB, gpus=(1,), user=BOB))
    assert [t.user for t in plan.targets] == [BOB] and not plan.forced
    assert [(s.user, s.gpu) for s in plan.skipped] == [(ALICE, 1)]


async def test_reset_planning_of_an_unknown_node_is_one_line(store: Store) -> None:
    cfg, transport = busy()
    reset = ResetService(cfg, transport, store, StatusService(cfg, transport, store))
    with pytest.raises(UsageError, match=r"^unknown node 'node9'$"):
        await reset.plan(ResetRequest(node="node9", requester=ALICE))
    assert transport.calls == []


async def test_a_program_the_script_does_not_know_is_exit_127() -> None:
    transport = ScriptedTransport(answer({}))
    cfg, _ = busy()
    got = await transport.run(cfg.nodes[0], ["timeout", "-k", "1", "5", "docker", "inspect"])
    assert (got.exit_status, got.stderr) == (127, "docker: not found\n")
