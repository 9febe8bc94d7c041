"""core/maint: ``/gpu maint`` parsed, its start read in UTC, a claim's overlap with a window,
who is told ahead and which nodes keep their alerts to themselves (issue 37)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpubot.core import commands
from gpubot.core.maint import (
    MaintEnd,
    MaintList,
    MaintOpen,
    Window,
    check_new,
    clash,
    due_holders,
    due_notices,
    quiet_nodes,
    refusal,
    starts_at,
)
from gpubot.errors import UsageError

# Thursday 2026-12-10 15:30 UTC
NOW = datetime(2026, 12, 10, 15, 30, tzinfo=UTC).timestamp()
H = 3600.0


def at(day: int, hour: int, minute: int = 0) -> float:
    return datetime(2026, 12, day, hour, minute, tzinfo=UTC).timestamp()


def window(start: float, hours: float = 4, node: str = "node3", **kw: object) -> Window:
    return Window(1, node, start, start + hours * H, "kernel update", "olga", NOW, **kw)  # type: ignore[arg-type]


def test_the_command_parses_from_for_because() -> None:
    cmd = commands.parse("/gpu maint node3 from Sat 02:00 for 4h because kernel update")
    assert cmd == MaintOpen("node3", "Sat 02:00", 4 * H, "kernel update")
    assert commands.parse("maint end node3") == MaintEnd("node3")
    assert commands.parse("maint") == MaintList()
    assert commands.parse("maint node3") == MaintList("node3")
    iso = commands.parse("maint node3 from 2026-12-12 02:00 for 1h30m because bios")
    assert isinstance(iso, MaintOpen) and iso.start == "2026-12-12 02:00"


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("maint node3 from Sat 02:00 for 4h", "say why"),
        ("maint node3 from Sat 02:00 because x", "say from when and for how long"),
        ("maint node3 from for 4h because x", "say from when"),
        ("maint node3 from Sat 02:00 for 4x because x", "bad duration '4x'"),
        ("maint node3 from Sat 02:00 for 30d because x", "at most 2w"),
        ("maint node3 from Sat 25:00 for 4h because x", "bad start 'Sat 25:00'"),
        ("maint node3 from Caturday 02:00 for 4h because x", "bad start"),
        ("maint node3 from Sat 02:00 for 4h please because x", "unexpected 'please'"),
        ("maint end node3 because x", "usage: /gpu maint end NODE"),
        ("maint n;rm from now for 1h because x", "bad node name"),
        ("status because x", "reason to reset, drain or maint only"),  # control: others refuse
    ],
)
def test_bad_input_is_one_line(line: str, says: str) -> None:
    with pytest.raises(UsageError, match=says) as got:
        commands.parse(line)
    assert "\n" not in str(got.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", NOW),
        ("Sat 02:00", at(12, 2)),  # the next Saturday
        ("saturday 02:00", at(12, 2)),
        ("Thu 16:00", at(10, 16)),  # today, still ahead
        ("Thu 15:00", at(17, 15)),  # today, past: next week
        ("18:00", at(10, 18)),
        ("09:00", at(11, 9)),  # past today: tomorrow
        ("tomorrow 02:00", at(11, 2)),
        ("today 20:15", at(10, 20, 15)),
        ("2026-12-12T02:00", at(12, 2)),
        ("2026-12-12 02:00", at(12, 2)),
        ("2026-12-12T02:00Z", at(12, 2)),
        ("2026-12-12T03:00+01:00", at(12, 2)),  # it says its zone
    ],
)
def test_start_forms_read_in_utc(text: str, expected: float) -> None:
    assert starts_at(text, NOW) == expected


def test_overlap_of_a_claim_with_a_window() -> None:
    w = window(at(12, 2))
    assert clash("node3", NOW, at(12, 3), [w]) is w  # ends inside it
    assert clash("node3", at(12, 5), at(12, 9), [w]) is w  # starts inside it
    assert clash("node3", NOW, at(12, 2), [w]) is None  # control: ends as it starts
    assert clash("node3", at(12, 6), at(12, 9), [w]) is None  # control: after it
    assert clash("node4", NOW, at(13, 0), [w]) is None  # control: another node
    early = window(at(12, 2), ended_at=at(12, 3))
    assert clash("node3", at(12, 3), at(12, 9), [early]) is None  # ended early: free again
    said = refusal(w, NOW, at(12, 3), NOW)
    assert "node3 is down for maintenance Sat 02:00–06:00 UTC: kernel update, by olga" in said
    assert "claim for at most 1d10h30m" in said


def test_a_new_window_may_not_overlap_or_be_over() -> None:
    w = window(at(12, 2))
    assert check_new(at(12, 6), 2 * H, NOW, [w]) == at(12, 8)  # back to back
    with pytest.raises(UsageError, match="has a window already"):
        check_new(at(12, 5), 2 * H, NOW, [w])
    with pytest.raises(UsageError, match="ended already"):
        check_new(NOW - 5 * H, 2 * H, NOW, [])


def test_alerts_are_held_only_while_a_window_is_open() -> None:
    w = window(at(12, 2))
    assert quiet_nodes([w], at(12, 1, 59)) == frozenset()  # control: not yet
    assert quiet_nodes([w], at(12, 2)) == {"node3"}
    assert quiet_nodes([w], at(12, 6)) == frozenset()  # control: over
    ended = window(at(12, 2), ended_at=at(12, 3))
    assert quiet_nodes([ended], at(12, 3, 1)) == frozenset()  # control: `maint end`


def test_holders_are_told_from_notify_before() -> None:
    w = window(at(12, 2))
    into = (7, "node3", "U0BOB", 1, at(11, 20), at(12, 4))
    before = (8, "node3", "U0DAVE", 2, at(11, 20), at(12, 1))
    other = (9, "node4", "U0CAROL", 0, at(11, 20), at(12, 4))
    claims = [into, before, other]
    assert due_notices([w], claims, at(12, 0, 59), H) == []  # control: not yet an hour ahead
    due = due_notices([w], claims, at(12, 1), H)
    assert [(a.claim_id, a.chat_id, a.subject) for a in due] == [(7, "U0BOB", "dm:maint:ahead:1:7")]
    assert due_notices([w], claims, at(12, 6), H) == []  # over: nothing to tell


def test_people_with_processes_on_the_node_are_told_once_each() -> None:
    w = window(at(12, 2))
    held = [
        ("node3", "U0BOB", 1, 4242),
        ("node3", "U0BOB", 0, 4243),
        ("node3", "U0DAVE", 2, 5000),
        ("node4", "U0CAROL", 0, 6000),  # another node: nothing to tell
    ]
    assert due_holders([w], held, at(12, 0, 59), H) == []  # control: not yet an hour ahead
    due = due_holders([w], held, at(12, 1), H)
    assert [(a.chat_id, a.held, a.subject) for a in due] == [
        ("U0BOB", ((0, 4243), (1, 4242)), "dm:maint:ahead:1:user:U0BOB"),
        ("U0DAVE", ((2, 5000),), "dm:maint:ahead:1:user:U0DAVE"),
    ]
    assert due_holders([w], held, at(12, 2), H) == []  # open: the node is being worked on
