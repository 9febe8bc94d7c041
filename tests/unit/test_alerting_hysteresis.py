"""Hysteresis (issue 25): an alerted finding resolves only after two sweeps that missed it."""

from __future__ import annotations

import pytest

from gpubot.core.alerting import CLEAR_SWEEPS, hold_clears
from gpubot.core.findings import FindingKey

A = FindingKey("n1", 0, "orphaned-vram")
B = FindingKey("n2", None, "node-unreachable")
C = FindingKey("n3", 1, "zombie-process", "7:99")

Counts = dict[FindingKey, int]


@pytest.mark.parametrize(
    ("what", "cleared", "alerted", "clearing", "unseen", "resolve", "counts"),
    [
        ("alerted, missed once: held", [A], {A}, {}, set(), [], {A: 1}),
        ("alerted, missed twice: resolves", [A], {A}, {A: 1}, set(), [A], {}),
        ("never alerted: resolves at once", [A], set(), {}, set(), [A], {}),
        ("found again: the count is dropped", [], {A}, {A: 1}, set(), [], {}),
        ("not looked at: the count carries", [], {A}, {A: 1}, {A}, [], {A: 1}),
        ("each on its own", [A, B], {A, B, C}, {B: 1, C: 1}, {C}, [B], {A: 1, C: 1}),
    ],
)
def test_hold_clears_table(
    what: str,
    cleared: list[FindingKey],
    alerted: set[FindingKey],
    clearing: Counts,
    unseen: set[FindingKey],
    resolve: list[FindingKey],
    counts: Counts,
) -> None:
    got = hold_clears(cleared, alerted, clearing, unseen=unseen)
    assert got == (resolve, counts), what


def test_a_finding_missed_in_every_other_sweep_never_resolves() -> None:
    clearing: Counts = {}
    for sweep in range(6):
        cleared = [A] if sweep % 2 else []  # found, missed, found, missed, ...
        resolve, clearing = hold_clears(cleared, {A}, clearing, unseen=set())
        assert resolve == [], sweep


def test_it_takes_clear_sweeps_looking_sweeps() -> None:
    clearing: Counts = {}
    resolved_at = None
    for sweep in range(1, 6):
        looked = sweep != 2  # sweep 2 could not look at n1 (it failed)
        cleared, unseen = ([A], set()) if looked else ([], {A})
        resolve, clearing = hold_clears(cleared, {A}, clearing, unseen=unseen)
        if resolve and resolved_at is None:
            resolved_at = sweep
    assert CLEAR_SWEEPS == 2 and resolved_at == 3
