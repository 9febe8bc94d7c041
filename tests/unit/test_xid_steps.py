"""Issue 34: a journal backlog is read in steps, as many as one read's budget allows.

A user's own faulting job can write kernel-log entries faster than one ``journalctl -n`` step a
sweep reads; a fatal Xid behind such a flood must not wait for the flood to stop. Over recorded
answers of the node's script (the scripted transport): no process, no socket, no sleep.
"""

from __future__ import annotations

from collections.abc import Callable

from gpubot.core.findings import Finding
from gpubot.core.health.codes import DRAIN_REBOOT
from gpubot.core.health.kernlog import APP_CODES, MAX_APP_LINES, MAX_LINES, parse_event, parse_time
from gpubot.core.models import CommandResult, GpuInfo, NodeConfig, NodeSnapshot
from gpubot.services.xid_watch import MAX_STEPS, XidWatch
from gpubot.transport.scripted import Call, ScriptedTransport, completed
from tests.fixtures.settings import ManualClock

BUSES = ("0000:18:00", "0000:19:00")
GPUS = tuple(
    GpuInfo(i, f"GPU-{i}", "H200", 0, 1, 0, bus_id=f"0000{b}.0") for i, b in enumerate(BUSES)
)
LINE79 = "2026-12-02T05:50:01+0000 n1 kernel: NVRM: Xid (PCI:0000:19:00): 79, GPU has fallen off"
LINE13 = (
    "2026-12-02T05:50:{s:02d}+0000 n1 kernel: NVRM: Xid (PCI:0000:18:00): 13, pid=201, "
    "name=python3, Graphics Exception"
)


def journal_of(log: list[str], taken: list[int]) -> Callable[[Call], CommandResult]:
    """The node's answers to ``journalctl -n N --after-cursor=C`` over ``log``, as the script
    sends them: the entries a step took, its lines under the caps, their counts, the cursor."""

    def journal(call: Call) -> CommandResult:
        after = int(call.argv[4].rsplit("=", 1)[1]) if call.argv[4] else 0
        step = log[after : after + int(call.argv[11])]
        taken.append(len(step))
        counts: dict[tuple[str, str], int] = {}
        events = [e for e in map(parse_event, step) if e is not None]
        for e in events:
            counts[(e.bus, str(e.code))] = counts.get((e.bus, str(e.code)), 0) + 1
        said = [f"@gpubot count {n} x {bus} {code}" for (bus, code), n in sorted(counts.items())]
        other = [e.line for e in events if e.code not in APP_CODES][-MAX_LINES:]
        app = [e.line for e in events if e.code in APP_CODES][-MAX_APP_LINES:]
        cursor = [f"-- cursor: s=t;i={after + len(step)}"] if step else []
        head = ["@gpubot source journal", f"@gpubot entries {len(step)}"]
        return completed(call.argv, "\n".join([*head, *other, *app, *said, *cursor]))

    return journal


async def read_backlog(
    log: list[str], reads: int, steps: int = MAX_STEPS
) -> tuple[list[dict[str, Finding]], list[int], XidWatch]:
    """Read ``log`` over ``reads`` sweeps, five entries a step; the findings after each."""
    taken: list[int] = []
    clock = ManualClock(parse_time("2026-12-02T05:51:00+0000"))
    watch = XidWatch(ScriptedTransport(journal_of(log, taken)), clock=clock, entries=5, steps=steps)
    out = []
    for _ in range(reads):
        await watch.read(NodeConfig("n1", "127.0.0.1"))
        snap = NodeSnapshot("n1", clock.now(), GPUS)
        out.append({f.key.holder: f for f in watch.findings([snap])})
    return out, taken, watch


BACKLOG = [LINE13.format(s=2 + i % 50) for i in range(12)] + [
    LINE79.replace("05:50:01", "05:50:59")
]


async def test_a_journal_backlog_of_several_steps_is_read_in_one_sweep_and_its_79_found() -> None:
    """A user's faulting job left 12 entries since the cursor, then GPU 1 fell off the bus.
    Each step takes at most 5 entries (journalctl -n after the cursor) and moves the cursor; a
    full step is followed by the next within the same read: the 79 is found on the first sweep."""
    (found,), taken, watch = await read_backlog(BACKLOG, 1)
    assert taken == [5, 5, 3]  # bounded steps, each after the last, in one read
    assert found["xid:79"].next_step == DRAIN_REBOOT and found["xid:79"].gpu == 1
    assert "12 in the window" in found["xid:13"].summary
    assert not any("behind" in n for n in watch.flag(NodeSnapshot("n1", 0, GPUS)).notes)


async def test_control_one_step_a_sweep_finds_the_79_only_on_the_third() -> None:
    reads, taken, _ = await read_backlog(BACKLOG, 3, steps=1)
    assert taken == [5, 5, 3]
    assert ["xid:79" in f for f in reads] == [False, False, True]


async def test_a_read_out_of_steps_says_it_is_behind_and_keeps_other_lines_first() -> None:
    """A 79 in the first step, then a flood of a job's own lines past the application cap over
    the next steps; the read ends with a full step: the node's note says it is behind."""
    log = [LINE79, *(LINE13.format(s=2 + i % 50) for i in range(MAX_APP_LINES + 200))]
    taken: list[int] = []
    clock = ManualClock(parse_time("2026-12-02T05:51:00+0000"))
    watch = XidWatch(ScriptedTransport(journal_of(log, taken)), clock=clock, entries=60, steps=4)
    await watch.read(NodeConfig("n1", "127.0.0.1"))
    snap = NodeSnapshot("n1", clock.now(), GPUS)
    found = {f.key.holder: f for f in watch.findings([snap])}
    assert taken == [60, 60, 60, 60]
    assert found["xid:79"].next_step == DRAIN_REBOOT  # kept: the application cap is its own
    dropped = 239 - MAX_APP_LINES
    assert f"239 in the window ({dropped} of them summarised" in found["xid:13"].summary
    note = f"kernel log: {dropped} application-error lines summarised; reading behind: 240"
    assert any(n.startswith(note) for n in watch.flag(snap).notes), watch.flag(snap).notes
