"""The Drain button on health findings whose next step is to drain, on Slurm nodes only, and
what pressing it asks for (the drain, by the presser, with the finding's summary as reason)."""

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
from gpubot.core.health.codes import DRAIN_REBOOT, RESET_WHEN_IDLE
from gpubot.core.health.xid import GPU_XID
from gpubot.errors import UsageError

AT = datetime(2030, 1, 1, 12, tzinfo=UTC)
BURST = (
    "Xid 79 GPU has fallen off the bus: the GPU is unreachable, 4 in the window by `bob`; "
    "fault: hardware; next step: drain and reboot (past the threshold of 3)"
)


def finding(step: str | None, node: str = "node1", summary: str = BURST) -> Finding:
    return Finding(node, 5, GPU_XID, "", summary, next_step=step)


def group(f: Finding, slurm: frozenset[str]) -> AlertGroup:
    return AlertGroup(f.node, (AlertItem(f.key, f, AT),), None, AT, slurm_nodes=slurm)


def buttons(f: Finding, slurm: frozenset[str]) -> dict[str, str]:
    return {a.id: a.value for a in render_alert_group(group(f, slurm)).actions}


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
