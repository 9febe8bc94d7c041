"""The Drain button on health findings whose next step is to drain, on Slurm nodes only, and
what pressing it asks for (the drain, by the presser, with the finding's summary as reason).

Which findings offer it is decided where they are made (``core.health``): the findings below
come from the real producers (``xid_findings``, ``find_health``), never written by hand."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpubot.chat.alerts import render_alert_group
from gpubot.chat.drain_view import ACTION_DRAIN_NODE, drain_of
from gpubot.chat.reset_view import ACTION_RESET_GPU
from gpubot.console.repl import typed
from gpubot.core.alerting import AlertGroup, AlertItem
from gpubot.core.commands import MAX_REASON, Drain
from gpubot.core.findings import Finding
from gpubot.core.health.codes import DRAIN_REBOOT, RESET_WHEN_IDLE, TICKET
from gpubot.core.health.findings import HealthMemory, find_health
from gpubot.core.health.kernlog import XidEvent
from gpubot.core.health.state import GpuHealth, NodeHealth
from gpubot.core.health.xid import GPU_XID, Seen, xid_findings
from gpubot.core.models import GpuInfo, NodeSnapshot
from gpubot.errors import UsageError

AT = datetime(2030, 1, 1, 12, tzinfo=UTC)
BURST = (
    "Xid 79 GPU has fallen off the bus: the GPU is unreachable, 4 in the window by `bob`; "
    "fault: hardware; next step: drain and reboot (past the threshold of 3)"
)
SLURM = frozenset({"node1"})
BUSES = ("0000:18:00", "0000:2a:00")  # GPU 0, GPU 1
SNAP = NodeSnapshot(
    "node1",
    100.0,
    tuple(
        GpuInfo(i, f"GPU-{i}", "H100", 0, 1, 0, bus_id=f"0000{b}.0") for i, b in enumerate(BUSES)
    ),
)


def finding(step: str | None, node: str = "node1", summary: str = BURST) -> Finding:
    return Finding(node, 5, GPU_XID, "", summary, next_step=step, drain=step == DRAIN_REBOOT)


def group(f: Finding, slurm: frozenset[str]) -> AlertGroup:
    return AlertGroup(f.node, (AlertItem(f.key, f, AT),), None, AT, slurm_nodes=slurm)


def buttons(f: Finding, slurm: frozenset[str]) -> dict[str, str]:
    return {a.id: a.value for a in render_alert_group(group(f, slurm)).actions}


def xids(*lines: tuple[int, int], sxid: str = "") -> list[Finding]:
    """The Xid findings of ``lines`` (code, GPU) in the window; ``sxid``: an SXid's words."""
    seen = [
        Seen("node1", XidEvent(bool(sxid), code, BUSES[gpu], 50.0 + i, sxid or "x"), 50.0 + i)
        for i, (code, gpu) in enumerate(lines)
    ]
    return xid_findings(seen, {"node1": SNAP}, now=100.0, window_s=3600.0)


def health(h: GpuHealth, before: GpuHealth | None = None) -> list[Finding]:
    """The health findings of GPU 0 reading ``h`` (after a sweep that read ``before``)."""
    memory = HealthMemory()
    if before is not None:
        _, memory = find_health([SNAP], {"node1": NodeHealth({0: before})}, memory)
    found, _ = find_health([SNAP], {"node1": NodeHealth({0: h})}, memory)
    return list(found)


def offered(found: list[Finding], slurm: frozenset[str] = SLURM) -> list[str]:
    """The summaries of the findings whose alert offers Drain."""
    return [f.summary for f in found if ACTION_DRAIN_NODE in buttons(f, slurm)]


NOT_READY = GpuHealth(0, fabric_state="In Progress", fabric_status="Failure")
BRAKE = GpuHealth(0, slowdown=("hw_slowdown",), power_w=90.0)  # the board's own power brake
HOT = GpuHealth(0, slowdown=("hw_thermal_slowdown",), temperature_c=92)


@pytest.mark.parametrize(
    ("found", "why"),
    [
        (xids((79, 0)), "next step: drain and reboot"),
        (xids((12028, 0), sxid="Fatal, Link 28"), "next step: drain and reboot"),
        (xids((64, 0)), "next step: hardware: open a ticket"),
        (xids((48, 0), (48, 0), (48, 0)), "3 in the window"),
        (xids((94, 1), (94, 1), (94, 1), (94, 1)), "4 in the window"),
        (xids((95, 0), (95, 0), (95, 0)), "3 in the window"),
        (health(NOT_READY), "NVSwitch fabric state In Progress, status Failure"),
        (health(GpuHealth(0, remap_failure=True)), "drain it and open a ticket"),
        (health(GpuHealth(0, 2), before=GpuHealth(0, 1)), "uncorrectable ECC errors grew"),
        (health(BRAKE, before=BRAKE), "HW slowdown is the board's own"),
    ],
    ids=[
        *("xid79", "sxid", "xid64", "xid48x3", "xid94x4", "xid95x3"),
        *("fabric", "remap", "ecc", "hw-slowdown"),
    ],
)
def test_a_drain_finding_on_a_slurm_node_offers_drain(found: list[Finding], why: str) -> None:
    (summary,) = offered(found)  # one finding of them: the one whose step is to drain
    assert why in summary, summary
    assert offered(found, frozenset()) == []  # the control: a node without a scheduler


@pytest.mark.parametrize(
    "found",
    [
        xids((48, 0)),  # a single 48: reset it when idle
        xids((48, 0), (48, 0)),  # twice
        xids((48, 0), (48, 1), (48, 0)),  # three, but not on the same GPU
        xids((94, 0), (95, 0), (48, 0)),  # three memory codes, each once
        xids(*[(13, 0)] * 6),  # the job's own code, however often
        xids((63, 0), (63, 0), (63, 0)),  # a pending remap: a reset applies it
        health(GpuHealth(0, remap_pending=True)),
        health(GpuHealth(0, 1)),  # an ECC error since load, not growing
        health(HOT, before=HOT),  # a thermal slowdown: the box's cooling, not the node
    ],
    ids=[
        *("xid48", "xid48x2", "xid48-two-gpus", "mixed", "xid13x6", "xid63x3"),
        *("pending", "ecc1", "thermal"),
    ],
)
def test_no_drain_for_findings_a_reset_or_the_job_answers(found: list[Finding]) -> None:
    assert found and offered(found) == []


def test_a_repeat_changes_no_next_step() -> None:
    """Drain is offered beside the code's advice, on Slurm nodes alone: a burst of 48 still says
    to reset the GPU when idle, with its Reset button, and a node without a scheduler sees the
    same finding as before."""
    (once,) = xids((48, 0))
    (thrice,) = xids((48, 0), (48, 0), (48, 0))
    assert once.next_step == thrice.next_step == RESET_WHEN_IDLE
    assert (once.drain, thrice.drain) == (False, True)
    assert thrice.summary.endswith("next step: reset when idle")
    assert ACTION_RESET_GPU in buttons(thrice, SLURM)
    assert set(buttons(thrice, frozenset())) == set(buttons(once, SLURM))
    (ticket,) = xids((64, 0))
    assert ticket.next_step == TICKET


def test_a_drain_finding_on_a_slurm_node_offers_drain_with_its_summary() -> None:
    got = buttons(finding(DRAIN_REBOOT), frozenset({"node1"}))
    reason = BURST.replace("`", "")
    assert got[ACTION_DRAIN_NODE] == f"node1 {reason}"
    assert drain_of(got[ACTION_DRAIN_NODE]) == Drain("node1", reason)


@pytest.mark.parametrize(
    ("step", "slurm"),
    [
        (DRAIN_REBOOT, frozenset()),  # the control: not a Slurm node
        (DRAIN_REBOOT, frozenset({"node2"})),  # another node is
        (RESET_WHEN_IDLE, frozenset({"node1"})),  # a Slurm node, but the next step is a reset
        (None, frozenset({"node1"})),
    ],
)
def test_no_drain_button_elsewhere(step: str | None, slurm: frozenset[str]) -> None:
    got = buttons(finding(step), slurm)
    assert ACTION_DRAIN_NODE not in got
    assert (ACTION_RESET_GPU in got) is (step == RESET_WHEN_IDLE)


def test_a_long_summary_is_cut_to_a_reason() -> None:
    long = "Xid 79 " + "x" * 500
    value = buttons(finding(DRAIN_REBOOT, summary=long), frozenset({"node1"}))[ACTION_DRAIN_NODE]
    cmd = drain_of(value)
    assert cmd.node == "node1" and cmd.reason is not None
    assert len(cmd.reason) == MAX_REASON and cmd.reason.startswith("Xid 79 xxx")


@pytest.mark.parametrize("bad", ["", "   "])
def test_a_value_without_a_node_is_one_line(bad: str) -> None:
    with pytest.raises(UsageError, match=r"^the Drain button names no node$"):
        drain_of(bad)


def test_the_console_types_the_drain_it_asks_for() -> None:
    shown = render_alert_group(group(finding(DRAIN_REBOOT), frozenset({"node1"})))
    (action,) = [a for a in shown.actions if a.id == ACTION_DRAIN_NODE]
    assert typed(action) == f"drain node1 because {BURST.replace('`', '')}"
