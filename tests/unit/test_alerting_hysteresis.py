"""Issue 25's pure alert rules: hysteresis (two clear sweeps) and one message per kind."""

from __future__ import annotations

import pytest

from gpubot.core.alerting import CLEAR_SWEEPS, by_message, digest_label, hold_clears
from gpubot.core.findings import (
    HIDDEN_HOLDER,
    NODE_UNREACHABLE,
    ORPHANED_VRAM,
    ZOMBIE_PROCESS,
    Finding,
    FindingKey,
    FindingKind,
)

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


# --- one message per finding kind (issue 25) ---------------------------------------------------


def finding(node: str, kind: FindingKind, gpu: int | None = None) -> Finding:
    return Finding(node, gpu, kind, "", "trouble")


def test_a_kind_on_several_nodes_is_one_digest_the_others_keep_their_node() -> None:
    fs = [
        finding("n1", NODE_UNREACHABLE),
        finding("n2", NODE_UNREACHABLE),
        finding("n3", ORPHANED_VRAM, 0),
        finding("n3", ZOMBIE_PROCESS, 1),
        finding("n4", HIDDEN_HOLDER, 0),
        finding("n5", HIDDEN_HOLDER, 2),
    ]
    groups = by_message(fs)
    assert {label: [(f.node, f.kind.value) for f in g] for label, g in groups.items()} == {
        "node unreachable on 2 nodes": [("n1", "node-unreachable"), ("n2", "node-unreachable")],
        "n3": [("n3", "orphaned-vram"), ("n3", "zombie-process")],
        "hidden GPU holder on 2 nodes": [("n4", "hidden-holder"), ("n5", "hidden-holder")],
    }
    kinds = [{f.kind for f in g} for g in groups.values()]
    assert all(a.isdisjoint(b) for i, a in enumerate(kinds) for b in kinds[i + 1 :])


@pytest.mark.parametrize(
    ("keys", "label"),
    [
        ([A], "n1"),
        ([A, FindingKey("n1", 2, "zombie-process")], "n1"),
        ([A, FindingKey("n9", 0, "orphaned-vram")], "orphaned GPU memory on 2 nodes"),
        ([A, B], "findings on 2 nodes"),  # a message of old, rebuilt: no single kind
    ],
)
def test_digest_label(keys: list[FindingKey], label: str) -> None:
    assert digest_label(keys) == label
