"""Xid/SXid: the table, the kernel-log parser and its trust rule, findings, and the watch's read
(cursor, dmesg's last timestamp, the script's bounds) over the scripted transport and real bash."""

from __future__ import annotations

import re

import pytest

from gpubot.core.health.codes import (
    CATALOG,
    DRAIN_REBOOT,
    LOOK_UP,
    RESET_WHEN_IDLE,
    TELL_OWNER,
    TICKET,
    XIDS,
    sxid_class,
    xid_class,
)
from gpubot.core.health.kernlog import (
    _XID,
    gpu_bus,
    parse_event,
    parse_kernlog,
    parse_time,
)
from gpubot.core.health.xid import Seen, xid_findings
from gpubot.core.models import GpuInfo, GpuProcess, NodeConfig, NodeSnapshot
from gpubot.services.xid_watch import XidWatch
from gpubot.transport.scripted import Call, ScriptedTransport, completed
from tests.fixtures.node_samples import LINE79
from tests.fixtures.settings import ManualClock

NODE = NodeConfig("n1", "127.0.0.1")


@pytest.mark.parametrize(
    ("code", "fault", "step"),
    [
        (13, "application", TELL_OWNER),
        (31, "application", TELL_OWNER),
        (43, "application", TELL_OWNER),
        (48, "memory", RESET_WHEN_IDLE),
        (63, "memory", RESET_WHEN_IDLE),
        (64, "memory", TICKET),
        (94, "memory", RESET_WHEN_IDLE),
        (95, "memory", RESET_WHEN_IDLE),
        (74, "nvlink", RESET_WHEN_IDLE),
        (79, "hardware", DRAIN_REBOOT),
        (119, "gsp", RESET_WHEN_IDLE),
        (120, "gsp", RESET_WHEN_IDLE),
        (999, "unknown", LOOK_UP),
    ],
)
def test_the_table_classifies_each_code(code: int, fault: str, step: str) -> None:
    cls = xid_class(code)
    assert (cls.fault, cls.step) == (fault, step)
    assert cls.source.startswith(CATALOG)  # each entry cites NVIDIA's catalog first


def test_every_entry_cites_its_source_and_app_codes_have_a_threshold() -> None:
    for cls in XIDS.values():
        assert "https://docs.nvidia.com/" in cls.source, cls
        if cls.fault == "application":
            assert cls.burst == 5 and cls.burst_step == RESET_WHEN_IDLE
    assert xid_class(92).step == "" and xid_class(92).burst == 3  # counted; a burst is a ticket
    assert sxid_class(12028, "Data {0x1}").step == DRAIN_REBOOT
    assert sxid_class(20009, "Non-fatal, Link 28 RX Short Error Rate").step == ""


def test_bus_ids_and_times() -> None:
    assert gpu_bus("00000000:18:00.0") == "0000:18:00"
    assert gpu_bus("00000001:C8:00.0") == "0001:c8:00"
    assert gpu_bus("garbage") is None and gpu_bus(None) is None
    # NVML's bus id reaches this unchecked on the local path: a legacy 4-digit domain, a missing
    # function or padding still names the GPU an Xid line is about
    assert gpu_bus("0000:52:00.0") == "0000:52:00"
    assert gpu_bus(" 00000000:52:00.0\n") == "0000:52:00"
    assert gpu_bus("00000000:52:00") == "0000:52:00"
    assert parse_time("2026-12-02T05:50:01+0000") == parse_time("2026-12-02T05:50:01,000000+00:00")
    assert parse_time("not a time") is None


FORGED = [
    # the kernel quotes a user's file name in this warning: an Xid-shaped name is not an Xid
    "2026-12-02T05:50:01+0000 n1 kernel: process 'sh' launched "
    "'NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.' with NULL argv",
    # a process name in another message
    "2026-12-02T05:50:01+0000 n1 kernel: python[42]: segfault at 0 NVRM: Xid (PCI:0000:18:00): 79",
    # a user's own journal message (not the kernel's): no "kernel:" tag
    "2026-12-02T05:50:01+0000 n1 alice[42]: NVRM: Xid (PCI:0000:18:00): 79, fake",
]


@pytest.mark.parametrize("line", FORGED)
def test_a_line_counts_only_when_the_drivers_words_start_it(line: str) -> None:
    assert parse_event(line) is None
    # control: the driver's pattern is in the line; a search anywhere in it would count it
    assert re.search(_XID.pattern.lstrip("^"), line) is not None


def test_a_hostile_comm_cannot_change_the_code_and_is_kept_for_display_only() -> None:
    line = (
        "2026-12-02T05:50:01+0000 n1 kernel: NVRM: Xid (PCI:0000:18:00): 13, pid=42, "
        "name=x, 79, GPU h, Graphics Exception"
    )
    e = parse_event(line)
    assert e is not None and e.code == 13 and e.pid == "42" and e.name == "x"
    gpus = (GpuInfo(0, "GPU-0", "H200", 0, 1, 0, bus_id="00000000:18:00.0"),)
    victim = GpuProcess(42, 0, 100, "python3", True, True, user="bob", start_ticks=7, elapsed_s=60)
    assert e.at is not None  # pid 42 had started by the line: it is the process that wrote it
    snap = NodeSnapshot("n1", e.at + 10, gpus, (victim,))
    (f,) = xid_findings([Seen("n1", e, 1.0)], {"n1": snap}, now=1.0, window_s=60.0)
    assert f.next_step == TELL_OWNER and f.owner == "bob"  # /proc's user of pid 42 on GPU 0
    assert f.pid is None  # nothing in a finding of the line names a process to signal


def test_an_unknown_bus_id_is_the_nodes_finding() -> None:
    e = parse_event(LINE79.replace("0000:18:00", "0000:ee:00"))
    assert e is not None
    gpus = (GpuInfo(0, "GPU-0", "H200", 0, 1, 0, bus_id="00000000:18:00.0"),)
    (f,) = xid_findings(
        [Seen("n1", e, 1.0)], {"n1": NodeSnapshot("n1", 0.0, gpus)}, now=1.0, window_s=60.0
    )
    assert f.gpu is None and f.key.holder == "xid:79:0000:ee:00"
    assert "bus id is unknown" in f.summary


def test_the_read_output_is_parsed_with_its_cursor() -> None:
    out = f"@gpubot source journal\n{LINE79}\n-- cursor: s=abc;i=12\n"
    got = parse_kernlog(out)
    assert got.source == "journal" and got.lines == (LINE79,) and got.cursor == "s=abc;i=12"
    denied = parse_kernlog("@gpubot journal-denied x\n@gpubot dmesg-denied y\n")
    assert denied.source is None and denied.denied == ("journal-denied x", "dmesg-denied y")
    assert parse_kernlog("@gpubot source journal\nFailed to seek to cursor: x\n").cursor_lost


async def test_the_watch_reads_after_its_cursor_and_dmesg_after_its_last_time() -> None:
    clock = ManualClock(parse_time("2026-12-02T05:50:30+0000"))
    answers = [
        f"@gpubot source journal\n{LINE79}\n-- cursor: s=a;i=1\n",
        "@gpubot source journal\n",  # nothing new: the cursor stays
        f"@gpubot source dmesg\n{LINE79.replace(' n1 kernel:', '')}\n",
        f"@gpubot source dmesg\n{LINE79.replace(' n1 kernel:', '')}\n",  # the same line again
    ]
    calls: list[Call] = []

    def handler(call: Call) -> object:
        calls.append(call)
        return completed(call.argv, answers[len(calls) - 1])

    counted: list[tuple[str, str, str]] = []
    watch = XidWatch(
        ScriptedTransport(handler),  # type: ignore[arg-type]
        clock=clock,
        count=lambda *c: counted.append(c),
    )
    gpus = (GpuInfo(3, "GPU-3", "H200", 0, 1, 0, bus_id="00000000:18:00.0"),)
    snap = NodeSnapshot("n1", 0.0, gpus)
    for _ in answers:
        await watch.read(NODE)
    assert [c.argv[4] for c in calls] == ["", "s=a;i=1", "s=a;i=1", "s=a;i=1"]
    assert calls[0].argv[5] == "-3600s"
    findings = watch.findings([snap])
    assert [(f.gpu, f.key.holder) for f in findings] == [(3, "xid:79")]
    assert counted == [("n1", "3", "79"), ("n1", "3", "79")]  # journal once, dmesg once


def test_each_new_line_counts_in_the_xid_metric() -> None:
    from gpubot.metrics import Metrics

    m = Metrics()
    m.count_xid("n1", "3", "79")
    m.count_xid("n1", "3", "79")
    m.count_xid("n1", "-", "sxid:12028")
    text = m.text()
    assert 'gpubot_gpu_xid_total{gpu="3",node="n1",xid="79"} 2.0' in text
    assert 'gpubot_gpu_xid_total{gpu="-",node="n1",xid="sxid:12028"} 1.0' in text


async def test_a_lost_cursor_reads_the_window_again_without_counting_twice() -> None:
    clock = ManualClock(parse_time("2026-12-02T05:50:30+0000"))
    answers = [
        f"@gpubot source journal\n{LINE79}\n-- cursor: s=a;i=1\n",
        "@gpubot source journal\nFailed to seek to cursor: Invalid argument\n",
        f"@gpubot source journal\n{LINE79}\n-- cursor: s=b;i=1\n",  # the window again
    ]
    calls: list[Call] = []

    def handler(call: Call) -> object:
        calls.append(call)
        return completed(call.argv, answers[len(calls) - 1])

    counted: list[tuple[str, str, str]] = []
    watch = XidWatch(
        ScriptedTransport(handler),  # type: ignore[arg-type]
        clock=clock,
        count=lambda *c: counted.append(c),
    )
    for _ in answers:
        await watch.read(NODE)
    assert [c.argv[4] for c in calls] == ["", "s=a;i=1", ""]  # lost: back to --since
    gpus = (GpuInfo(0, "GPU-0", "H200", 0, 1, 0, bus_id="00000000:18:00.0"),)
    watch.findings([NodeSnapshot("n1", 0.0, gpus)])
    assert counted == [("n1", "0", "79")]  # control: without the check it would count twice
