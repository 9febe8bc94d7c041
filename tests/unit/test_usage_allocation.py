"""Slurm's allocated GPU-hours beside observed ones in the report: per user, per team (summed
from users), "allocated, unused" never below zero, and the forms that carry them."""

from __future__ import annotations

import csv
import io

from gpubot.chat.report_view import render_usage
from gpubot.console.text_render import render_text
from gpubot.core.usage.report import (
    NO_TEAM,
    Coverage,
    Line,
    UsageReport,
    Window,
    with_allocation,
)

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
