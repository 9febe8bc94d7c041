"""``/gpu drain`` and ``/gpu resume`` against a real single-node Slurm (Debian's 22.05), typed at
the console as people of the Slack tables, over SSH on the simulated fleet.

The fleet's node1 is a Slurm node (``scheduler = "slurm"``) whose ``slurm_node`` is the
fixture's NodeName; its sessions run this machine's real ``scontrol`` (wrappers first on PATH
carry ``SLURM_CONF``). What Slurm holds is read back with the real ``sinfo`` and ``scontrol``,
never from gpubot's own answer. U0CAROL is an on-call approver: her own drain is the approval.
U0BOB may act on node1 ([permissions]) but is no approver: his drain or resume is a request that
an approver decides (``approve N`` / ``deny N`` at the console, the same store transition as the
Slack buttons). U0EVE may act on node2 only (here), not on node1: she is refused.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpubot.app import App, build
from gpubot.chat.alerts import render_alert_group
from gpubot.chat.drain_view import ACTION_DRAIN_NODE
from gpubot.chat.reset_view import ACTION_APPROVE
from gpubot.config import Settings
from gpubot.console.front import ConsoleFront
from gpubot.console.repl import answer
from gpubot.core.alerting import AlertItem
from gpubot.core.findings import Finding
from gpubot.core.health.codes import DRAIN_REBOOT
from gpubot.core.health.xid import GPU_XID
from gpubot.core.models import ApprovalState
from gpubot.core.policy import Person
from gpubot.slack.blockkit import message_text
from gpubot.store import open_store
from gpusim.fleet import SimFleet
from tests.fixtures.daemons import need
from tests.fixtures.real_runs import quick_settings, real_fleet
from tests.fixtures.settings import with_tables
from tests.fixtures.slack import FakeSlack, running_bot, slack_tables, workload_owner
from tests.fixtures.slack_flows import request_in_oncall, updates_of
from tests.fixtures.slurm import SlurmCluster
from tests.procs import wait_until

T0 = datetime(2030, 1, 1, 12, tzinfo=UTC)


@pytest.fixture(scope="module")
def fleet(
    slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SimFleet]:
    with real_fleet(
        tmp_path_factory.mktemp("slurm-drain"), ["slurm"], [slurm_cluster.bin_dir]
    ) as f:
        yield f


def slurm_settings(fleet: SimFleet, slurm_node: str | None, scheduler: str | None) -> Settings:
    """The fleet's settings with the Slack tables, node1 a Slurm node named ``slurm_node``."""
    tables = slack_tables(workload_owner(fleet))
    # U0EVE may act on the even nodes only (node2), never on the Slurm node node1
    permissions = {**tables["permissions"], "odd": [], "even": ["U0EVE"]}
    s = with_tables(quick_settings(fleet, None), {**tables, "permissions": permissions})
    nodes = tuple(
        dataclasses.replace(n, scheduler=scheduler, slurm_node=slurm_node)
        if n.name == "node1"
        else n
        for n in s.nodes
    )
    return dataclasses.replace(s, nodes=nodes)


@pytest.fixture
async def app_for(tmp_path: Path) -> AsyncIterator[Any]:
    """Build console apps on a fresh audit database; close them all at the end."""
    url = f"sqlite:///{tmp_path}/audit.db"
    init = open_store(url, check_schema=False)
    init.upgrade()
    init.close()
    built: list[App] = []

    def make(settings: Settings) -> App:
        app = build(
            dataclasses.replace(settings, database_url=url),
            {},
            need_store=True,
            front=ConsoleFront(),
        )
        built.append(app)
        return app

    yield make
    for app in built:
        await app.close()


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The module's Slurm, its node returned to service after each test."""
    yield slurm_cluster
    if not slurm_cluster.idle():
        scontrol(slurm_cluster, "update", f"NodeName={slurm_cluster.node_name}", "State=RESUME")
        wait_until(slurm_cluster.idle, 30, "the Slurm node idle again")


def scontrol(cluster: SlurmCluster, *args: str) -> str:
    return cluster.cli(*args, check=False, timeout=30).stdout


def slurm_says(cluster: SlurmCluster) -> tuple[str, str]:
    """Return the node's state and reason as the real ``sinfo`` shows them (``%T|%E``)."""
    out = cluster.cli(
        "-h", "-n", cluster.node_name, "-o", "%T|%E", program=need("sinfo", "slurm-wlm"), timeout=30
    ).stdout.strip()
    state, _, reason = out.partition("|")
    return state, reason


def person(app: App, user_id: str) -> Person:
    from gpubot.cli.console import identity

    assert app.flows is not None
    return identity(app.flows.svc.policy, user_id)


async def test_an_approver_drains_and_resumes_a_real_slurm_node(
    fleet: SimFleet, cluster: SlurmCluster, app_for: Any
) -> None:
    app = app_for(slurm_settings(fleet, cluster.node_name, "slurm"))
    flows = app.flows
    carol, eve = person(app, "U0CAROL"), person(app, "U0EVE")
    assert slurm_says(cluster) == ("idle", "none")

    refused = await answer(flows, "/gpu drain node1 because xid 79", eve)
    assert refused.strip() == ("⛔ you may not drain Slurm's node node1 (see [permissions])"), (
        refused
    )
    assert slurm_says(cluster) == ("idle", "none")  # the control: nothing reached Slurm
    assert await drained_findings(app) == []  # the control of the finding below: in service

    text = await answer(flows, "/gpu drain node1 because xid 79", carol)
    audit_id = int(re.search(r"audit #(\d+)", text).group(1))  # type: ignore[union-attr]
    reason = f"gpubot audit #{audit_id}, approved by carol: xid 79"  # her Linux user
    assert "Slurm drained node1" in text and reason in text, text
    assert slurm_says(cluster) == ("drained", reason)
    # sinfo -R lists it with the user that set it (gpubot's SSH user: root here)
    listed = cluster.cli("-R", "-h", "-o", "%E|%N", program=need("sinfo", "slurm-wlm")).stdout
    assert f"{reason}|{cluster.node_name}" in listed.splitlines()
    # a sweep now finds the node Slurm holds drained: gpubot's reason, its record, its age
    (drained,) = await drained_findings(app)
    assert (drained.node, drained.gpu) == ("node1", None)
    age = r"\d+ [a-z]+( \d+ [a-z]+)?"  # "0 s", "1 min 5 s"
    said = rf"Slurm holds the node idle\+drain for {age} by root: {re.escape(reason)}"
    assert re.fullmatch(said, drained.summary), drained.summary

    again = await answer(flows, "/gpu drain node1 because something else", carol)
    assert "node1" in again and "is drained already" in again and reason in again, again
    assert slurm_says(cluster) == ("drained", reason)  # Slurm's reason is not overwritten

    refused = await answer(flows, "resume node1", eve)
    assert refused.strip() == "⛔ you may not resume Slurm's node node1 (see [permissions])"
    assert slurm_says(cluster)[0] == "drained"

    back = await answer(flows, "resume node1", carol)
    assert "Slurm returned to service node1" in back and "IDLE+DRAIN" in back, back
    wait_until(cluster.idle, 30, "node back in service")
    assert slurm_says(cluster) == ("idle", "none")
    still = await answer(flows, "resume node1", carol)
    assert "is in service already" in still, still

    assert flows.svc.audit is not None
    actions = await flows.svc.audit.actions(node="node1", limit=10)
    got = [(a.command, a.actor, a.status) for a in reversed(actions)]
    assert got == [
        ("/gpu drain node1 because xid 79", "U0EVE", "refused"),
        ("/gpu drain node1 because xid 79", "U0CAROL", "done"),
        ("/gpu drain node1 because something else", "U0CAROL", "unchanged"),
        ("resume node1", "U0EVE", "refused"),
        ("resume node1", "U0CAROL", "done"),
        ("resume node1", "U0CAROL", "unchanged"),
    ]
    assert actions[-2].id == audit_id  # the record Slurm's reason names
    assert app.store is not None
    detail = await app.store.action(audit_id)
    assert detail is not None
    assert detail.summary.kind == "drain"
    assert detail.approval is not None and detail.approval["approver"] == "U0CAROL"
    assert detail.plan["slurm_node"] == cluster.node_name and detail.plan["reason"] == "xid 79"
    assert detail.result["slurm_reason"] == reason  # what the outcome says was written
    assert detail.result["after"] == {"state": "IDLE+DRAIN", "reason": reason}
    # the node's journal names the drain and the resume, each with its audit record (issue 37)
    drain_line = (
        f'drain node1: Slurm node "{cluster.node_name}" because "xid 79" by "U0CAROL", '
        f'approved by "U0CAROL", audit #{audit_id}'
    )
    lines = fleet.node("node1").kernel.user_lines("gpubot")
    assert len(lines) == 2 and lines[0] == drain_line  # unchanged ones write nothing
    assert lines[1].startswith(f'resume node1: Slurm node "{cluster.node_name}" by ')
    assert detail.result["node_log"] == {"line": drain_line, "ok": True, "exit_status": 0}


async def drained_findings(app: App) -> list[Finding]:
    """Return the ``slurm-node-drained`` findings of a sweep now (read-only, no alerts)."""
    result = await app.sweep.run(alerting=False)
    return [f for f in result.findings if f.kind == "slurm-node-drained"]


def request_id(text: str) -> int:
    found = re.search(r"Request #(\d+)", text)
    assert found is not None, text
    return int(found.group(1))


async def test_a_permitted_non_approver_drains_and_resumes_through_an_approval(
    fleet: SimFleet, cluster: SlurmCluster, app_for: Any
) -> None:
    app = app_for(slurm_settings(fleet, cluster.node_name, "slurm"))
    flows = app.flows
    carol, bob = person(app, "U0CAROL"), person(app, "U0BOB")
    assert app.store is not None and flows.svc.audit is not None
    assert slurm_says(cluster) == ("idle", "none")

    # a drain asked and denied: nothing reaches Slurm (the control of the approved one)
    asked = await answer(flows, "/gpu drain node1 because xid 79 on GPU 5", bob)
    first = request_id(asked)
    assert "Approval needed · drain of node1" in asked and "Approve" in asked, asked
    assert "Waiting for an on-call approver" in asked, asked
    assert slurm_says(cluster) == ("idle", "none")  # asking changes nothing
    denied = await answer(flows, f"deny {first}", carol)
    assert "Denied by" in denied and "nothing was changed in Slurm" in denied, denied
    assert slurm_says(cluster) == ("idle", "none")
    again = await answer(flows, f"approve {first}", carol)  # decided once: never run after all
    assert "already denied" in again, again
    assert slurm_says(cluster) == ("idle", "none")

    # asked again, approved: Slurm's reason names the approver and the audit record
    second = request_id(await answer(flows, "/gpu drain node1 because xid 79 on GPU 5", bob))
    selfie = await answer(flows, f"approve {second}", bob)
    assert selfie.strip() == "⛔ you cannot approve your own request: ask another approver"
    assert slurm_says(cluster) == ("idle", "none")  # self-approval refused: nothing sent
    done = await answer(flows, f"approve {second}", carol)
    audit_id = int(re.search(r"audit #(\d+)", done).group(1))  # type: ignore[union-attr]
    reason = f"gpubot audit #{audit_id}, approved by carol: xid 79 on GPU 5"
    assert "Slurm drained node1" in done and reason in done, done
    assert slurm_says(cluster) == ("drained", reason)
    listed = cluster.cli("-R", "-h", "-o", "%E|%N", program=need("sinfo", "slurm-wlm")).stdout
    assert f"{reason}|{cluster.node_name}" in listed.splitlines()
    twice = await answer(flows, f"approve {second}", carol)  # the store's transition: once
    assert twice.strip() == f"⛔ approval {second} is already executed by U0CAROL", twice
    assert slurm_says(cluster) == ("drained", reason)

    # a resume asked and denied leaves it drained; approved, it returns to service
    third = request_id(await answer(flows, "resume node1", bob))
    await answer(flows, f"deny {third}", carol)
    assert slurm_says(cluster) == ("drained", reason)
    fourth = request_id(await answer(flows, "resume node1", bob))
    back = await answer(flows, f"approve {fourth}", carol)
    assert "Slurm returned to service node1" in back, back
    wait_until(cluster.idle, 30, "node back in service")
    assert slurm_says(cluster) == ("idle", "none")

    states = [(await app.store.approvals.get(i)) for i in (first, second, third, fourth)]
    assert [str(a.state) for a in states if a is not None] == [
        "denied",
        "executed",
        "denied",
        "executed",
    ]
    actions = await flows.svc.audit.actions(node="node1", limit=20)
    ran = [(a.kind, a.actor, a.status) for a in reversed(actions) if a.kind in ("drain", "resume")]
    assert ran == [("drain", "U0CAROL", "done"), ("resume", "U0CAROL", "done")]
    detail = await app.store.action(audit_id)
    assert detail is not None and detail.summary.command == (
        "/gpu drain node1 because xid 79 on GPU 5"
    )
    assert detail.approval is not None
    assert (detail.approval["id"], detail.approval["requester"]) == (second, "U0BOB")
    assert detail.approval["approver"] == "U0CAROL"
    assert detail.result["slurm_reason"] == reason


async def test_the_drain_button_of_a_finding_drains_through_slack_and_the_approval(
    fleet: SimFleet, cluster: SlurmCluster, fake_slack: FakeSlack, tmp_path: Path
) -> None:
    """An Xid 79 burst's alert on the Slurm node offers *Drain node*; U0BOB presses it (signed
    requests into the bolt app), the request reaches on-call, U0CAROL's *Approve* drains the
    real node with the finding's summary as the reason."""
    summary = (
        "Xid 79 GPU has fallen off the bus: the GPU is unreachable, 4 in the window; "
        "fault: hardware; next step: drain and reboot (past the threshold of 3)"
    )
    f = Finding("node1", 5, GPU_XID, "", summary, next_step=DRAIN_REBOOT, drain=True)
    settings = slurm_settings(fleet, cluster.node_name, "slurm")
    db = f"sqlite:///{tmp_path}/audit.db"
    async with running_bot(settings, fake_slack, db) as h:
        keeper = h.app.sweep.keeper
        assert keeper is not None and keeper.slurm_nodes == {"node1"}  # from the settings
        alert = render_alert_group(keeper.group("node1", (AlertItem(f.key, f, T0),), T0))
        (value,) = [a.value for a in alert.actions if a.id == ACTION_DRAIN_NODE]
        await h.send.click(ACTION_DRAIN_NODE, value, user="U0BOB", channel="C0GENERAL")
        await h.settle()
        approval_id, ts = request_in_oncall(fake_slack)
        assert slurm_says(cluster) == ("idle", "none")  # asked, not approved: nothing sent
        await h.send.click(ACTION_APPROVE, str(approval_id), user="U0CAROL", message_ts=ts)
        await h.settle()
        state, reason = slurm_says(cluster)
        found = re.fullmatch(
            rf"gpubot audit #(\d+), approved by (\S+): {re.escape(summary)}", reason
        )
        assert state == "drained" and found is not None, reason
        assert h.store is not None
        approval = await h.store.approvals.get(approval_id)
        assert approval is not None and approval.state is ApprovalState.EXECUTED
        assert approval.requester == "U0BOB" and approval.decided_by == "U0CAROL"
        assert found.group(2) == "carol"  # her Linux user, not a name she chose in Slack
        action = await h.store.action(int(found.group(1)))
        assert action is not None and action.summary.kind == "drain"
        assert action.summary.command == f"/gpu drain node1 because {summary} (alert button)"
        assert action.summary.actor == "U0CAROL" and action.result["slurm_reason"] == reason
        shown = message_text(updates_of(fake_slack, ts)[-1].body)
        assert "Slurm drained node1" in shown and f"audit #{found.group(1)}" in shown, shown


async def test_a_drain_gpubot_did_not_set_is_not_resumed(
    fleet: SimFleet, cluster: SlurmCluster, app_for: Any
) -> None:
    """An admin's drain (a bad PSU) is a person's to lift: gpubot's resume says whose it is and
    sends nothing; the control, gpubot's own drain, resumes (the test above)."""
    name = cluster.node_name
    scontrol(cluster, "update", f"NodeName={name}", "State=DRAIN", "Reason=PSU bad, keep out")
    wait_until(lambda: slurm_says(cluster)[0] == "drained", 30, "the admin's drain")
    app = app_for(slurm_settings(fleet, name, "slurm"))
    text = await answer(app.flows, "resume node1", person(app, "U0CAROL"))
    assert "not by gpubot: PSU bad, keep out" in text and "State=RESUME, by hand" in text, text
    assert slurm_says(cluster) == ("drained", "PSU bad, keep out")  # nothing was sent


async def test_slurm_refusal_is_one_line_and_audited_as_failed(
    fleet: SimFleet, cluster: SlurmCluster, app_for: Any
) -> None:
    app = app_for(slurm_settings(fleet, "nosuch-node", "slurm"))
    carol = person(app, "U0CAROL")
    text = await answer(app.flows, "drain node1 because xid 79", carol)
    assert text.strip() == "⚠ Slurm cannot show node nosuch-node: Node nosuch-node not found"
    assert slurm_says(cluster) == ("idle", "none")
    (action,) = await app.flows.svc.audit.actions(node="node1", limit=5)
    assert (action.actor, action.status) == ("U0CAROL", "error")


async def test_a_node_without_slurm_is_refused_in_one_line(
    fleet: SimFleet, cluster: SlurmCluster, app_for: Any
) -> None:
    app = app_for(slurm_settings(fleet, None, None))
    carol = person(app, "U0CAROL")
    text = await answer(app.flows, "drain node1 because xid 79", carol)
    assert text.splitlines()[0] == (
        '⚠ node1 is not a Slurm node (its settings name no scheduler = "slurm"): '
        "gpubot drains and resumes Slurm nodes only"
    )
    assert slurm_says(cluster) == ("idle", "none")
    assert await app.flows.svc.audit.actions(node="node1", limit=5) == []


async def test_slurm_refusing_the_update_itself_is_one_line_and_audited(
    fleet_factory: Callable[..., SimFleet],
    cluster: SlurmCluster,
    sim_users: tuple[str, ...],
    app_for: Any,
) -> None:
    """gpubot's SSH account is alice, no Slurm operator (this cluster has no accounting: only
    root and SlurmUser may update a node): she may read the node, so the drain gets as far as
    ``scontrol update``, which slurmctld refuses. The answer is one line with Slurm's words,
    the audit record's outcome is an error, and the node stays idle (``sinfo``)."""
    alice = fleet_factory(
        nodes=1,
        gpus=4,
        view_user=sim_users[0],
        runtimes=["slurm"],
        session_path=[str(cluster.bin_dir)],
    )
    app = app_for(slurm_settings(alice, cluster.node_name, "slurm"))
    text = await answer(app.flows, "drain node1 because xid 79", person(app, "U0CAROL"))
    assert text.strip() == (
        f"⚠ Slurm refused to drain {cluster.node_name}: slurm_update error: Invalid user id"
    ), text
    assert slurm_says(cluster) == ("idle", "none")
    (action,) = await app.flows.svc.audit.actions(node="node1", limit=5)
    assert (action.kind, action.actor, action.status) == ("drain", "U0CAROL", "error")
    assert app.store is not None
    detail = await app.store.action(action.id)
    assert detail is not None and detail.result["ok"] is False
    assert detail.result["error"] == text.strip().removeprefix("⚠ ")
    (sent,) = detail.result["sent"]
    assert sent.startswith(f"scontrol update NodeName={cluster.node_name} State=DRAIN"), sent
