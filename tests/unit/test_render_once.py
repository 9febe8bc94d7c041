"""Two texts of issue 33 that said too much: "device files not checked" in yellow under every
healthy node of ``gpubot status`` (now once, in the footer), and "freed (0 → 0 MiB)" for an
idle GPU that a reset had nothing to free (now "already free (0 MiB)")."""

from __future__ import annotations

import pytest

from gpubot.chat.reset_view import result_rows
from gpubot.cli.render import render_fleet, render_reset, render_snapshot
from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot, Outcome
from gpubot.core.probe.holders import NOT_CHECKED
from gpubot.core.reset.outcome import GpuResult, outcome_words
from gpubot.core.reset.plan import ResetRequest, plan_reset
from gpubot.core.reset.protect import Protection
from gpubot.services.reset import ResetResult
from gpubot.services.status import FleetStatus

CAVEAT = "nvidia-smi's processes account for all GPU memory"


def gpu(i: int, used: int) -> GpuInfo:
    return GpuInfo(i, f"GPU-{i:04d}", "NVIDIA H100", used, 81920, 0, bus_id=f"0:{i}", minor=i)


def node(name: str, *, checked: bool) -> NodeSnapshot:
    notes = () if checked else (NOT_CHECKED,)
    return NodeSnapshot(name, 0.0, (gpu(0, 0), gpu(1, 0)), (), notes=notes)


def test_not_checked_is_said_once_in_the_footer() -> None:
    status = FleetStatus((node("node1", checked=False), node("node2", checked=False)))
    text = render_fleet(status)
    assert text.count(CAVEAT) == 1  # was: under each node
    footer = text[text.index("device files not checked") :]
    assert footer.startswith("device files not checked on every node: ")
    assert text.index("node2") < text.index("device files not checked")  # after the tables


def test_the_footer_names_the_nodes_that_were_not_checked() -> None:
    status = FleetStatus(
        (node("node1", checked=False), node("node2", checked=True), node("node3", checked=False))
    )
    text = render_fleet(status)
    assert text.count(CAVEAT) == 1 and "device files not checked on node1, node3: " in text


def test_control_all_checked_no_footer_and_one_node_still_shows_its_note() -> None:
    status = FleetStatus((node("node1", checked=True), node("node2", checked=True)))
    assert "not checked" not in render_fleet(status)
    alone = "\n".join(render_snapshot(node("node1", checked=False)))  # e.g. a reset's "after"
    assert "device files not checked" in alone


def result(before: int, after: int, *, busy: bool) -> ResetResult:
    proc = GpuProcess(42, 0, before, "python", True, True, user="alice", uid=1000, start_ticks=7)
    procs = (proc,)
    snap = NodeSnapshot("node1", 0.0, (gpu(0, before),), procs if busy else ())
    plan = plan_reset(snap, ResetRequest("node1", "alice", gpus=(0,)), Protection())
    g = GpuResult(0, Outcome.FREED, f"memory at {after} MiB", before, after, 0.4)
    return ResetResult("node1", plan, (g,), (), snap, None, 1)


def test_an_idle_gpu_is_already_free() -> None:
    idle = result(0, 0, busy=False)
    text = render_reset(idle)
    assert "GPU 0: already free (0 MiB)" in text and "0 → 0" not in text  # was: freed (0 → 0 MiB)
    assert result_rows(idle)[1][3] == "✅ already free"
    assert idle.ok and idle.to_dict()["gpus"][0]["outcome"] == "freed"  # the outcome is the same


def test_control_a_gpu_a_process_was_killed_on_is_freed() -> None:
    busy = result(4096, 0, busy=True)
    assert busy.plan.targets  # the process was planned, and killed
    assert "GPU 0: freed in 0.40 s  (4096 → 0 MiB)" in render_reset(busy)
    assert result_rows(busy)[1][3] == "✅ freed"


@pytest.mark.parametrize(
    ("outcome", "before", "after", "signalled", "words"),
    [
        (Outcome.FREED, 0, 0, False, "already free"),
        (Outcome.FREED, 3, 3, False, "already free"),  # the driver's own share
        (Outcome.FREED, 0, 0, True, "freed"),  # a target held no memory: it was still killed
        (Outcome.FREED, 2048, 0, False, "freed"),  # gpu-reset of leaked memory: no target
        (Outcome.FREED, None, 0, False, "freed"),  # before unknown: say no more than freed
        (Outcome.ORPHANED, 0, 0, False, "orphaned"),
    ],
)
def test_outcome_words(
    outcome: Outcome, before: int | None, after: int, signalled: bool, words: str
) -> None:
    g = GpuResult(0, outcome, "", before, after, None)
    assert outcome_words(g, signalled) == words
