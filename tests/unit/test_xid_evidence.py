"""Issue 34: Xid evidence is per faulting process, and a kernel-log read nobody can flood.

An application Xid burst (a job's own errors) is counted over distinct processes and owners,
never over lines: one process's burst on another user's GPU stays its owner's finding, with no
*Reset GPU* offered. The read keeps other driver lines before application errors, each under its
own cap, and what a cap dropped arrives as a count per (bus, code): summarised, never lost. Pure
(the core, the watch over the scripted transport): no process, no socket, no sleep.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from unittest.mock import patch

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpubot.chat.alerts import item_parts
from gpubot.chat.reset_view import ACTION_RESET_GPU
from gpubot.core.alerting import AlertGroup, AlertItem
from gpubot.core.findings import Finding
from gpubot.core.health.codes import DRAIN_REBOOT, RESET_WHEN_IDLE, TELL_OWNER, TICKET
from gpubot.core.health.kernlog import (
    APP_CODES,
    MAX_APP_LINES,
    MAX_LINES,
    XidEvent,
    parse_event,
    parse_kernlog,
    parse_time,
    summaries,
)
from gpubot.core.health.xid import Group, Seen, known_owner, xid_findings
from gpubot.core.models import CommandResult, GpuInfo, GpuProcess, NodeConfig, NodeSnapshot
from gpubot.core.runtimes.base import Workload
from gpubot.core.usage.idle import holder_owner
from gpubot.services.xid_watch import XidWatch
from gpubot.transport.scripted import Call, ScriptedTransport, completed
from tests.fixtures.settings import ManualClock

OwnerRule = Callable[[GpuProcess], str | None]
T0 = 1_790_000_000.0  # the lines' time; every process below started an hour before
BUSES = ("0000:18:00", "0000:19:00")
GPUS = tuple(
    GpuInfo(i, f"GPU-{i}", "H200", 0, 1, 0, bus_id=f"0000{b}.0") for i, b in enumerate(BUSES)
)


def proc(pid: int, user: str, gpu: int = 0, *, started: float = T0 - 3600) -> GpuProcess:
    """A process on ``gpu`` as the probe reads it (``/proc``'s user, its age at the snapshot)."""
    age = int(T0 + 60 - started)
    return GpuProcess(
        pid, gpu, 1024, "python3", True, True, user=user, start_ticks=7, elapsed_s=age
    )


BOB = proc(100, "bob")  # bob's 30 GB job: GPU 0 is his
SNAP = NodeSnapshot(
    "n1",
    T0 + 60,
    GPUS,
    (
        BOB,
        proc(201, "mallory"),
        proc(202, "mallory"),
        proc(203, "mallory"),
        proc(301, "alice"),
        proc(302, "carol"),
        proc(400, "dave", started=T0 + 30),  # pid 400 started after the lines: reused
    ),
)


def xid(code: int, pid: int | None, *, gpu: int = 0, at: float = T0) -> Seen:
    """One Xid line of the driver's shape, on ``gpu``, from ``pid`` (None: the line has none)."""
    who = "" if pid is None else f"pid={pid}, name=python3, "
    e = parse_event(f"NVRM: Xid (PCI:{BUSES[gpu]}): {code}, {who}Graphics Exception: ESR 0x1")
    assert e is not None
    return Seen("n1", XidEvent(**{**e.__dict__, "at": at}), at)


def find(lines: list[Seen]) -> dict[str, Finding]:
    return {
        f.key.holder: f for f in xid_findings(lines, {"n1": SNAP}, now=T0 + 60, window_s=3600.0)
    }


def offers_reset(f: Finding) -> bool:
    """Whether the alert of ``f`` carries the *Reset GPU* button (the chat's own rule)."""
    at = datetime.fromtimestamp(T0, UTC)
    item = AlertItem(f.key, f, at)
    _, actions = item_parts(item, AlertGroup(f.node, (item,), SNAP, at))
    return actions is not None and any(a.id == ACTION_RESET_GPU for a in actions.actions)


def test_one_process_burst_on_another_users_gpu_is_its_owners_with_no_reset() -> None:
    """mallory's pid 201 opens a context on bob's GPU 0 and faults five times."""
    found = find([xid(13, 201) for _ in range(5)])
    assert set(found) == {"xid:13"}  # no second finding for on-call
    f = found["xid:13"]
    assert f.next_step == TELL_OWNER and f.owner == "mallory"  # not bob, whose GPU it is
    assert "5 in the window" in f.summary
    assert "raised by 1 process: pid `201` `python3` (`mallory`'s) ×5" in f.summary
    assert not offers_reset(f)


@pytest.mark.parametrize(
    ("pids", "why"),
    [
        ([201, 301, 302, 301, 302], "three owners' processes"),
        ([201, 201, 201, 201, 301], "two owners: mallory's four lines and alice's one"),
        ([901, 902, 301, 903, 201], "two known owners among processes gone by the sweep"),
    ],
)
def test_control_a_burst_across_processes_or_owners_is_on_calls_with_the_reset(
    pids: list[int], why: str
) -> None:
    found = find([xid(13, p) for p in pids])
    burst = found["xid:13:burst"]
    assert burst.next_step == RESET_WHEN_IDLE and burst.owner is None, why
    assert offers_reset(burst)
    assert f"raised by {len(set(pids))} processes" in burst.summary


def test_control_a_code_that_is_not_the_jobs_own_counts_lines() -> None:
    found = find([xid(74, 201) for _ in range(3)])  # NVLink: one process's lines suffice
    assert found["xid:74:burst"].next_step == TICKET
    assert offers_reset(found["xid:74"])  # its own step is "reset when idle"


@pytest.mark.parametrize(
    ("pids", "owner", "words"),
    [
        ([201, 202, 203, 201, 202], "mallory", "raised by 3 processes: "),  # all one owner's
        ([None] * 6, None, "6 lines name no pid"),  # no pid: cannot show several processes
        ([400] * 5, None, "(pid reused since the line)"),  # dave's pid 400 is younger
        ([201, 201, None, None, None], "mallory", "3 lines name no pid"),
        # three processes gone by the sweep: owners unknown, never counted as three people
        ([901, 902, 903, 901, 902], None, "raised by 3 processes: "),
        ([901, 902, 903, 201, 904], None, "(no longer on the GPU)"),  # not all mallory's
        ([201, 201, 901], None, "(no longer on the GPU)"),  # the last unknown: not hers
    ],
)
def test_what_stays_the_owners(pids: list[int | None], owner: str | None, words: str) -> None:
    found = find([xid(13, p) for p in pids])
    assert set(found) == {"xid:13"}
    assert found["xid:13"].owner == owner and words in found["xid:13"].summary
    assert not offers_reset(found["xid:13"])


# --- owners are what root names: never a subordinate uid or an unnamed slice ----------------

SUBORDINATE = NodeSnapshot(  # alice's job holds GPU 0; mallory runs as two subordinate uids
    "n1",
    T0 + 60,
    GPUS,
    (
        proc(301, "alice"),
        proc(501, "231072"),  # podman unshare / newuidmap: no passwd entry, the uid as digits
        proc(502, "231073"),
        replace(proc(601, "1003"), workload=Workload("podman", "a", owner="uid 1003")),
        replace(proc(602, "1004"), workload=Workload("podman", "b", owner="uid 1004")),
    ),
)


def find_on(snap: NodeSnapshot, lines: list[Seen], owner: OwnerRule = known_owner) -> list[Finding]:
    with patch("gpubot.core.health.xid.known_owner", owner):
        return xid_findings(lines, {"n1": snap}, now=T0 + 60, window_s=3600.0)


@pytest.mark.parametrize(
    "pids", [[501, 502, 501, 502, 501], [601, 602, 601, 602, 601], [501, 602, 501, 602, 501]]
)
def test_unnamed_uids_are_never_distinct_people(pids: list[int]) -> None:
    """mallory faults on alice's GPU 0 as two unnamed uids: no burst, no reset, no DM to them."""
    found = {f.key.holder: f for f in find_on(SUBORDINATE, [xid(13, p) for p in pids])}
    assert set(found) == {"xid:13"} and found["xid:13"].owner is None
    assert (
        "(no named owner)" in found["xid:13"].summary and " owners" not in found["xid:13"].summary
    )
    assert not offers_reset(found["xid:13"])
    # control: the old rule (the workload's owner, else the process's user, digits or not)
    old = {f.key.holder: f for f in find_on(SUBORDINATE, [xid(13, p) for p in pids], holder_owner)}
    assert old["xid:13:burst"].next_step == RESET_WHEN_IDLE and offers_reset(old["xid:13:burst"])


def test_control_named_accounts_still_make_a_burst() -> None:
    found = {f.key.holder: f for f in find_on(SUBORDINATE, [xid(13, p) for p in [301, 501, 201]])}
    assert "xid:13:burst" not in found  # alice and one unnamed uid: one person at most
    two = [xid(13, p) for p in [301, 201, 301, 201, 301]]
    assert find(two)["xid:13:burst"].next_step == RESET_WHEN_IDLE  # alice and mallory


def test_a_lone_named_owner_is_not_handed_other_processes_lines() -> None:
    """mallory's 300 lines from short-lived processes, then one of alice's live job, then one of
    a gone process last: a plain finding, never a DM to alice counting mallory's lines."""
    lines = [xid(13, 7000 + i, at=T0 + i / 1000) for i in range(300)]
    lines += [xid(13, 301, at=T0 + 1), xid(13, 9999, at=T0 + 2)]
    f = find(lines)["xid:13"]
    assert f.owner is None and f.next_step == TELL_OWNER
    # control: the old fallback (the one named owner) made it alice's
    named = {s.owner for s in Group("n1", 0, "", tuple(lines), SNAP).sources()} - {None}
    assert named == {"alice"}
    # and when every process is alice's, the finding is hers even if the last line's is unknown
    alone = [xid(13, 301), xid(13, 301)]
    assert find(alone)["xid:13"].owner == "alice"


def test_the_last_lines_owner_is_not_handed_the_groups_lines() -> None:
    """mallory's 300 lines from short-lived processes on alice's GPU 0, then one of alice's
    live job LAST: never a DM to alice of 301 lines (a plain finding, nobody addressed)."""
    lines = [xid(13, 7000 + i, at=T0 + i / 1000) for i in range(300)] + [xid(13, 301, at=T0 + 1)]
    f = find(lines)["xid:13"]
    assert f.owner is None and f.next_step == TELL_OWNER
    assert "301 in the window" in f.summary and "raised by 301 processes" in f.summary
    # control: the old rule (the owner of the last line's process) made all 301 alice's
    sources = Group("n1", 0, "", tuple(lines), SNAP).sources()
    assert [s.owner for s in sources if s.pid == 301] == ["alice"]
    # a flood the read's cap dropped (pids unknown) beside her one kept line: not hers either
    (dropped,) = summaries({(False, BUSES[0], 13): 301}, [lines[-1].event], None)
    capped = find([Seen("n1", dropped, T0), lines[-1]])["xid:13"]
    assert capped.owner is None and "300 of them summarised" in capped.summary
    assert find([lines[-1]])["xid:13"].owner == "alice"  # control: her line alone is hers


@given(
    code=st.sampled_from(APP_CODES),
    pid=st.integers(1, 4_000_000),
    n=st.integers(1, 400),
    gpu=st.sampled_from([0, 1]),
)
def test_one_process_never_makes_an_application_burst_on_calls(
    code: int, pid: int, n: int, gpu: int
) -> None:
    found = find([xid(code, pid, gpu=gpu, at=T0 + i / 1000) for i in range(n)])
    assert all(f.next_step != RESET_WHEN_IDLE for f in found.values())


@pytest.mark.parametrize("n", [5, 20, 200])
def test_one_users_short_lived_processes_never_offer_a_reset_of_another_users_gpu(n: int) -> None:
    """mallory runs ``n`` faulting processes in turn on bob's GPU 0; each has exited by the
    sweep, so no owner is known: still mallory's trouble (or nobody's proven), never on-call's
    reset of bob's job."""
    found = find([xid(13, 5000 + i, at=T0 + i / 1000) for i in range(n)])
    assert set(found) == {"xid:13"}, found.keys()
    assert found["xid:13"].owner is None and found["xid:13"].next_step == TELL_OWNER
    assert f"raised by {n} processes: " in found["xid:13"].summary
    assert "(no longer on the GPU)" in found["xid:13"].summary
    assert not offers_reset(found["xid:13"])


@given(
    code=st.sampled_from(APP_CODES),
    gone=st.lists(st.integers(10_000, 4_000_000), max_size=30, unique=True),
    live=st.lists(st.sampled_from([201, 202, 203]), max_size=30),
    n=st.integers(0, 200),
    gpu=st.sampled_from([0, 1]),
)
def test_one_owners_processes_never_make_an_application_burst_on_calls(
    code: int, gone: list[int], live: list[int], n: int, gpu: int
) -> None:
    """Any mix of mallory's live processes, processes gone by the sweep and repeated lines:
    never a reset for on-call (one known owner at most)."""
    pids = gone + live + [(gone + live + [201])[i % (len(gone + live) + 1)] for i in range(n)]
    found = find([xid(code, p, gpu=gpu, at=T0 + i / 1000) for i, p in enumerate(pids)])
    assert all(f.next_step != RESET_WHEN_IDLE for f in found.values())
    assert not any(offers_reset(f) for f in found.values())


# --- the read a user cannot flood ------------------------------------------------------------

LINE79 = "2026-12-02T05:50:01+0000 n1 kernel: NVRM: Xid (PCI:0000:19:00): 79, GPU has fallen off"
LINE13 = (
    "2026-12-02T05:50:{s:02d}+0000 n1 kernel: NVRM: Xid (PCI:0000:18:00): 13, pid=201, "
    "name=python3, Graphics Exception"
)


def node_answer(n13: int) -> str:
    """What the node's script sends for a log of one Xid 79, then ``n13`` Xid 13 lines: the
    other lines, the newest application lines, the counts, the cursor (as ``pick`` writes)."""
    app = [LINE13.format(s=2 + i % 50) for i in range(n13)]
    return "\n".join(
        [
            "@gpubot source journal",
            LINE79,
            *app[-MAX_APP_LINES:],
            "@gpubot count 1 x 0000:19:00 79",
            f"@gpubot count {n13} x 0000:18:00 13",
            "-- cursor: s=a;i=1",
        ]
    )


async def test_a_flood_of_application_lines_is_summarised_and_never_hides_an_xid_79() -> None:
    raw = [LINE79, *(LINE13.format(s=2 + i % 50) for i in range(450))]
    assert LINE79 not in raw[-MAX_LINES:]  # control: the newest-400 rule alone dropped the 79
    clock = ManualClock(parse_time("2026-12-02T05:51:00+0000"))
    watch = XidWatch(
        ScriptedTransport(lambda c: completed(c.argv, node_answer(450))),
        clock=clock,
    )
    await watch.read(NodeConfig("n1", "127.0.0.1"))
    snap = NodeSnapshot("n1", clock.now(), GPUS)
    found = {f.key.holder: f for f in watch.findings([snap])}
    assert found["xid:79"].next_step == DRAIN_REBOOT and found["xid:79"].gpu == 1
    assert "450 in the window (350 of them summarised" in found["xid:13"].summary
    assert "kernel log: 350 application-error lines summarised" in watch.flag(snap).notes


@pytest.mark.parametrize(
    ("counts", "kept", "after", "want"),
    [
        ({(False, "0000:18:00", 13): 3}, [13, 13, 13], None, []),  # nothing dropped
        ({(False, "0000:18:00", 13): 9}, [13, 13], None, [(13, 7)]),
        # the cap kept no 79 (others flooded it): its count still makes a finding
        ({(False, "0000:18:00", 79): 1, (False, "0000:18:00", 74): 1}, [74], None, [(79, 1)]),
        # dmesg: a class whose oldest kept line was seen before dropped nothing new
        ({(False, "0000:18:00", 13): 9}, [13, 13], T0 + 5, []),
        ({(False, "0000:18:00", 13): 9}, [13, 13], T0 - 5, [(13, 7)]),
    ],
)
def test_what_a_cap_dropped_becomes_a_summary(
    counts: dict[tuple[bool, str, int], int],
    kept: list[int],
    after: float | None,
    want: list[tuple[int, int]],
) -> None:
    events = [xid(c, 201).event for c in kept]
    got = summaries(counts, events, after)
    assert [(e.code, e.count) for e in got] == want
    assert all(e.summary and e.pid is None for e in got)


@given(
    counts=st.dictionaries(
        st.tuples(st.booleans(), st.sampled_from(BUSES), st.integers(0, 99999)),
        st.integers(1, 10**9 - 1),
        max_size=20,
    )
)
def test_the_counts_round_trip(counts: dict[tuple[bool, str, int], int]) -> None:
    text = "@gpubot source journal\n" + "".join(
        f"@gpubot count {n} {'s' if s else 'x'} {b.upper()} {c}\n"
        for (s, b, c), n in counts.items()
    )
    assert (parse_kernlog(text).counts or {}) == counts


@given(st.text(max_size=300))
def test_no_text_breaks_the_read_parser(text: str) -> None:
    got = parse_kernlog("@gpubot source journal\n" + text)
    assert all(n > 0 for n in (got.counts or {}).values())


# --- dmesg's counts, read twice (a journal backlog: test_xid_steps.py) ----------------------------

DMESG13 = "{ts} NVRM: Xid (PCI:{bus}): 13, pid={pid}, name=python3, Graphics Exception"


def dmesg_answer(ring: list[str]) -> str:
    """What the node's script sends for a dmesg ring buffer of ``ring`` (all Xid 13 lines): the
    newest application lines and the counts of the WHOLE buffer, as ``pick`` writes them."""
    counts: dict[str, int] = {}
    for line in ring:
        bus = line.split("(PCI:")[1][:10]
        counts[bus] = counts.get(bus, 0) + 1
    return "\n".join(
        [
            "@gpubot source dmesg",
            *ring[-MAX_APP_LINES:],
            *(f"@gpubot count {n} x {bus} 13" for bus, n in sorted(counts.items())),
        ]
    )


async def test_dmesg_read_twice_never_summarises_a_line_already_seen() -> None:
    """Read 1: one Xid 13 on GPU 0. Read 2: that line still in the ring, and 150 new ones on
    GPU 1, of which the cap keeps 100: 50 are summarised, not 51 (the GPU 0 line is not new)."""
    clock = ManualClock(T0 + 100)
    ts = [
        datetime.fromtimestamp(T0 + i, UTC).strftime("%Y-%m-%dT%H:%M:%S,%f+00:00")
        for i in range(200)
    ]
    ring = [DMESG13.format(ts=ts[0], bus=BUSES[0], pid=201)]
    answers = [dmesg_answer(ring)]
    ring += [DMESG13.format(ts=ts[1 + i // 2], bus=BUSES[1], pid=202) for i in range(150)]
    answers += [dmesg_answer(ring), dmesg_answer(ring)]  # the third: nothing new
    calls: list[Call] = []

    def handler(call: Call) -> CommandResult:
        calls.append(call)
        return completed(call.argv, answers[len(calls) - 1])

    watch = XidWatch(ScriptedTransport(handler), clock=clock)
    node = NodeConfig("n1", "127.0.0.1")
    await watch.read(node)
    clock.advance(60)
    await watch.read(node)
    snap = NodeSnapshot("n1", clock.now(), GPUS)
    found = {(f.gpu, f.key.holder): f for f in watch.findings([snap])}
    assert "once" in found[(0, "xid:13")].summary  # control (the old read): "2 in the window"
    assert "summarised" not in found[(0, "xid:13")].summary
    assert "150 in the window (50 of them summarised" in found[(1, "xid:13")].summary
    assert "kernel log: 50 application-error lines summarised" in watch.flag(snap).notes
    clock.advance(60)
    await watch.read(node)  # the same ring again: nothing new, nothing summarised again
    found = {(f.gpu, f.key.holder): f for f in watch.findings([snap])}
    assert "150 in the window (50 of them summarised" in found[(1, "xid:13")].summary
