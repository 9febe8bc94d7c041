"""Slurm's allocated GPU-hours beside observed ones in the report: per user, per team (summed
from users), "allocated, unused" never below zero, the forms that carry them, and the weekly
digest's service asking Slurm's accounting (sacct's recorded answer, tests/corpus/slurm/)."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from gpubot.chat.report_view import render_usage
from gpubot.config import Settings
from gpubot.console.text_render import render_text
from gpubot.core.alerting import Delivery, Lookup, MessageRef, Posted
from gpubot.core.findings import SweepConfig
from gpubot.core.models import CommandResult, GpuInfo, GpuProcess, NodeConfig, NodeSnapshot
from gpubot.core.usage.report import (
    NO_TEAM,
    Coverage,
    Digest,
    Line,
    UsageReport,
    Window,
    with_allocation,
)
from gpubot.services.digest import DigestService
from gpubot.services.outbox import Outbox
from gpubot.services.usage import UsageService
from gpubot.store import open_store
from tests.fixtures.clock import VirtualClock

H = 3_600_000  # ms in an hour


def line(name: str, busy_h: float) -> Line:
    return Line(name, round(busy_h * H), 0, 0, 0, 0, 1)


def test_per_user_allocated_and_unused_never_below_zero() -> None:
    lines = (line("alice", 3), line("bob", 5), line("carol", 1))
    out = with_allocation(
        lines,
        "user",
        {"alice": 10 * H, "bob": 2 * H, "dan": 4 * H},
        {
            "alice": 3 * H,
            "bob": 5 * H,
        },
    )
    got = {ln.name: (ln.allocated, ln.alloc_unused) for ln in out}
    assert got == {
        "alice": (10 * H, 7 * H),
        "bob": (2 * H, 0),  # used more than allocated (outside Slurm too): not negative
        "carol": (0, 0),  # seen, never allocated
        "dan": (4 * H, 4 * H),  # allocated, never seen: a line of their own
    }


def test_teams_sum_their_users_unused() -> None:
    teams = {"vision": ("alice", "bob"), "nlp": ("bob",)}
    out = with_allocation(
        (line("vision", 8), line("nlp", 5)),
        "team",
        {"alice": 10 * H, "bob": 2 * H, "eve": H},
        {"alice": 3 * H, "bob": 5 * H},
        teams,
    )
    got = {ln.name: (ln.allocated, ln.alloc_unused) for ln in out}
    # vision: alice 7 unused + bob 0 (not bob's -3): users' clamped figures summed
    assert got == {"vision": (12 * H, 7 * H), "nlp": (2 * H, 0), NO_TEAM: (H, H)}


def report(allocation: bool, lines: tuple[Line, ...]) -> UsageReport:
    return UsageReport(
        Window(0, 3600), "user", lines, Coverage(1, 300.0), allocation, ("a Slurm note",)
    )


def test_the_forms_carry_the_columns_only_with_allocation() -> None:
    lines = with_allocation((line("alice", 1),), "user", {"alice": 3 * H}, {"alice": H})
    on = report(True, lines)
    row = on.to_dict()["rows"][0]  # type: ignore[index]
    assert row["allocated_ms"] == 3 * H and row["allocated_unused_h"] == 2.0
    header, first = list(csv.reader(io.StringIO(on.csv())))
    assert header[-3:] == ["allocated_h", "allocated_unused_h", "samples"]
    assert first[-3:] == ["3.000", "2.000", "1"]
    assert on.table()[0][-2:] == ["allocated h", "alloc. unused h"]
    text = on.text()
    assert "most allocated, unused: alice 2.0 h of 3.0 h allocated by Slurm" in text
    assert "a Slurm note" in text

    off = report(False, (line("alice", 1),))  # the control: no allocation read
    assert "allocated_ms" not in off.to_dict()["rows"][0]  # type: ignore[index]
    assert "allocated" not in off.csv() and "allocated h" not in off.table()[0]
    assert "most allocated" not in off.text()


def test_the_weekly_digest_names_the_largest_allocated_unused() -> None:
    lines = with_allocation(
        (line("alice", 1), line("bob", 1)),
        "user",
        {"alice": 3 * H, "bob": 9 * H},
        {"alice": H, "bob": 2 * H},
    )
    shown = render_text(render_usage(report(True, lines), title="Weekly GPU-hours"))
    assert "most allocated, unused: bob 7.0 h of 9.0 h allocated by Slurm" in shown
    plain = render_text(render_usage(report(False, (line("bob", 1),)), title="Weekly GPU-hours"))
    assert "most allocated" not in plain  # the control


SACCT = Path(__file__).resolve().parent.parent / "corpus" / "slurm" / "sacct-22.05-epoch.txt"
SLURM_NODE = "gpusim27749x80d160"  # the recorded cluster's NodeName
T4 = 1796580562  # the recording's job 4 (gpusim-alice, 1 GPU) started, still running


class Sacct:
    """node1's transport: ``sacct`` answers its recorded output; it records what was asked."""

    def __init__(self) -> None:
        self.asked: list[list[str]] = []

    async def run(
        self, node: NodeConfig, argv: Sequence[str], *, timeout: float | None = None
    ) -> CommandResult:
        self.asked.append(list(argv))
        assert "sacct" in argv, argv
        return CommandResult(tuple(argv), 0, SACCT.read_text(encoding="utf-8"), "")

    async def close(self) -> None:
        return None


class Told:
    """The digest's front end: each report as the channel's text shows it."""

    def __init__(self) -> None:
        self.posts: list[str] = []

    async def post(self, report: UsageReport, *, token: str) -> Posted:
        self.posts.append(render_text(render_usage(report, title="Weekly GPU-hours")))
        return Posted(Delivery.POSTED, MessageRef(f"C0DIGEST/{len(self.posts)}"))

    async def find(self, token: str, since: datetime) -> Lookup:
        return Lookup(True)


async def test_the_digest_service_names_the_largest_allocated_unused(tmp_path: Path) -> None:
    """Monday's digest over a week whose sacct is the recording: gpusim-alice's running job 4
    counts to the week's end, less the two hours her process was seen on node1."""
    digest = Digest.parse("mon 09:00")
    due = digest.last_due(T4 + 86400)  # the Monday 09:00 after the recording
    node = NodeConfig("node1", "h", scheduler="slurm", slurm_node=SLURM_NODE)
    settings = Settings(nodes=(node,), sweep=SweepConfig(interval_s=900.0))
    clock, sacct, told = VirtualClock(due - 3 * 3600), Sacct(), Told()
    store = open_store(f"sqlite:///{tmp_path / 'gpubot.db'}")
    try:
        usage = UsageService(settings, store.usage, clock=clock, transport=sacct)
        proc = GpuProcess(4242, 0, 8192, "python3", True, True, user="gpusim-alice", start_ticks=1)
        for i in range(8):  # two hours of alice's busy GPU on node1
            at = due - 3 * 3600 + i * 900.0
            gpu = GpuInfo(0, "GPU-0", "H200", 8192, 143771, 50)
            await usage.record([NodeSnapshot("node1", at, (gpu,), (proc,))], at)
        clock.step(3 * 3600 + 300.0)
        svc = DigestService(digest, "user", usage, Outbox(store.outbox), told, clock=clock)
        assert await svc.run_due() is not None
    finally:
        store.close()
    allocated_s = 2 * 2 + 1 * (due - T4)  # jobs 1 (2 GPUs, 2 s) and 4 (1 GPU, to the end)
    unused_h, allocated_h = (allocated_s - 2 * 3600) / 3600, allocated_s / 3600
    (shown,) = told.posts
    line = f"most allocated, unused: gpusim-alice {unused_h:.1f} h of {allocated_h:.1f} h"
    assert line in shown, shown
    (argv,) = sacct.asked  # the Slurm node's NodeName, once
    assert argv[argv.index("-N") + 1] == SLURM_NODE
