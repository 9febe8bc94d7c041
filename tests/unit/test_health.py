"""The health exec's answer and what it means, in tables (pure: ``core.health.state``,
``core.health.findings``); the sweep over real SSH is tests/integration/test_sweep_health.py."""

from __future__ import annotations

import pytest

from gpubot.core.health.findings import ECC_HOLD, HealthMemory, find_health
from gpubot.core.health.state import (
    FIELD_SETS,
    GpuHealth,
    Links,
    NodeHealth,
    health_argv,
    health_blockers,
    parse_health,
)
from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot

H100 = (
    "0, 0, 0, No, No, No, Not Active, Not Active, Not Active, 35, 71.20, Completed, Success, 700.00"
)
GEFORCE = (
    "0, [N/A], [N/A], [N/A], [Not Supported], [Not Supported], Not Active, Not Active, "
    "Not Active, 41, 30.11, [N/A], [N/A], 350.00"
)


def answer(rows: str, *, set_name: str = "r535", status: int = 0, fm: str = "none") -> str:
    return f"\n@gpubot health {set_name} {status}\n{rows}\n\n@gpubot nvlink 0\n\n@gpubot fm {fm}\n"


def test_a_datacenter_gpu_reads_whole() -> None:
    h = parse_health(answer(H100)).gpus[0]
    assert (h.ecc_volatile, h.remap_pending, h.fabric_state, h.fabric_ready) == (
        0,
        False,
        "Completed",
        True,
    )
    assert h.temperature_c == 35 and h.power_w == 71.2 and h.flags() == ()


def test_na_and_not_supported_are_unknown_never_an_alarm() -> None:
    h = parse_health(answer(GEFORCE)).gpus[0]
    assert (h.ecc_volatile, h.ecc_aggregate, h.retired_pending) == (None, None, None)
    assert (h.remap_pending, h.remap_failure, h.fabric_state, h.fabric_ready) == (None,) * 4
    assert h.flags() == () and health_blockers(h) == ()
    assert _kinds(h) == []


@pytest.mark.parametrize(
    ("text", "note"),
    [
        (answer("0, 1, 2"), "1 health row(s) could not be read"),
        (answer('Field "fabric.state" is not a valid field to query.', status=2), "failed"),
        ("", "health query failed: no answer"),
    ],
)
def test_what_cannot_be_read_is_a_note(text: str, note: str) -> None:
    h = parse_health(text)
    assert h.gpus == {} and any(note in n for n in h.notes)


@pytest.mark.parametrize(
    ("fm", "said"),
    [
        ("running 812 0", "running (pid 812)"),
        ("running 812 1000", "not running (pid 812 is named like it but runs as uid 1000)"),
        ("stale", "not running (stale pid file)"),
        ("none", "not running"),
    ],
)
def test_the_fabric_manager(fm: str, said: str) -> None:
    assert parse_health(answer(H100, fm=fm)).fabric_manager == said


def test_the_argv_carries_every_set_and_refuses_a_relative_pid_file() -> None:
    argv = health_argv("nvidia-smi", 3.0)
    assert argv[:2] == ["bash", "-c"] and [a.split("=")[0] for a in argv[8:]] == list(FIELD_SETS)
    with pytest.raises(ValueError, match="absolute"):
        health_argv("nvidia-smi", 3.0, fm_pid="run/fm.pid")


def _snap(*procs: GpuProcess) -> NodeSnapshot:
    return NodeSnapshot("n", 0.0, (GpuInfo(0, "GPU-0", "H100", 0, 1, 0),), procs)


def _kinds(h: GpuHealth, memory: HealthMemory | None = None) -> list[str]:
    found, _ = find_health([_snap()], {"n": NodeHealth({0: h})}, memory or HealthMemory())
    return [f.kind.value for f in found]


def test_ecc_grows_then_holds_then_clears() -> None:
    mem = HealthMemory()
    seen: list[list[str]] = []
    for count in [3, 3, 5, 5, 5, 5, 5, 5]:
        found, mem = find_health([_snap()], {"n": NodeHealth({0: GpuHealth(0, count)})}, mem)
        seen.append([f.kind.value for f in found])
    load, grew = ["ecc-since-load"], ["ecc-since-load", "ecc-uncorrected"]
    # a volatile count above 0 is found at the first reading and stands; growth is a second one
    assert seen == [load, load, grew, *[grew] * (ECC_HOLD - 1), *[load] * (8 - 2 - ECC_HOLD)]


def test_a_lifetime_count_alone_is_only_a_baseline() -> None:
    h = GpuHealth(0, ecc_volatile=0, ecc_aggregate=5)
    found, _ = find_health([_snap()], {"n": NodeHealth({0: h})}, HealthMemory())
    assert found == ()


def test_throttling_takes_two_sweeps() -> None:
    hot = GpuHealth(0, slowdown=("hw_slowdown",), temperature_c=80)
    mem = HealthMemory()
    first, mem = find_health([_snap()], {"n": NodeHealth({0: hot})}, mem)
    second, _ = find_health([_snap()], {"n": NodeHealth({0: hot})}, mem)
    assert first == () and [f.kind.value for f in second] == ["gpu-throttled"]
    assert "hardware: open a ticket" in second[0].summary  # not thermal: the board's own


def test_a_remap_next_step_follows_who_holds_the_gpu() -> None:
    h = GpuHealth(0, remap_pending=True)
    idle, _ = find_health([_snap()], {"n": NodeHealth({0: h})}, HealthMemory())
    job = GpuProcess(7, 0, 100, "python", True, True, user="ana", start_ticks=1)
    busy, _ = find_health([_snap(job)], {"n": NodeHealth({0: h})}, HealthMemory())
    assert idle[0].summary.endswith("it is idle: gpu-reset n gpu 0 now")
    assert "1 process(es) hold it: stop them first" in busy[0].summary


def test_links_are_judged_against_the_expected_set_alone() -> None:
    """Inactive links are down only where they should be up (tests/unit/test_nvlink.py learns
    the set); control: the same links with the set said are down."""
    assert _kinds(GpuHealth(0, links=Links((), (0, 1, 2, 3)))) == []
    assert _kinds(GpuHealth(0, links=Links((0, 1), (2,)))) == []
    assert _kinds(GpuHealth(0, links=Links((0, 1), (2,), expected=(0, 1, 2)))) == ["nvlink-down"]


def test_health_shows_in_status_json_and_metrics() -> None:
    import json

    from gpubot.cli.render import snapshot_dict
    from gpubot.metrics import Metrics
    from gpubot.services.health_checks import with_health

    hot = H100.replace("Not Active, Not Active, Not Active", "Not Active, Active, Not Active")
    health = parse_health(answer(f"{hot}\n{GEFORCE.replace('0,', '1,', 1)}"))
    info = (GpuInfo(0, "GPU-0", "H100", 0, 1, 0), GpuInfo(1, "GPU-1", "RTX", 0, 1, 0))
    snap = with_health(NodeSnapshot("n", 0.0, info), health)
    assert snap.gpus[0].health is not None and snap.gpus[0].health.slowdown == (
        "hw_thermal_slowdown",
    )
    text = json.dumps(snapshot_dict(snap))
    assert '"throttled:hw-thermal-slowdown"' in text and '"remapped_rows_pending": false' in text
    m = Metrics()
    m.observe_sweep([snap], [], 1.0, {})
    out = m.text()
    assert 'gpubot_gpu_remapped_rows_pending{gpu="0",node="n",uuid="GPU-0"} 0.0' in out
    assert (
        'gpubot_gpu_throttled{gpu="0",node="n",reason="hw_thermal_slowdown",uuid="GPU-0"} 1.0'
        in out
    )
    assert 'gpubot_gpu_remapped_rows_pending{gpu="1"' not in out  # [Not Supported]: no series


def test_a_lost_gpu_leaves_the_others_rows() -> None:
    lost = "Unable to determine the device handle for GPU0000:CB:00.0: Unknown Error"
    h = parse_health(answer(f"{lost}\n{H100}", status=15))
    assert list(h.gpus) == [0] and h.notes == ()


def test_health_flags_show_on_the_home_tab() -> None:
    from gpubot.chat.home import render_home
    from gpubot.console.text_render import render_text as text_of
    from gpubot.services.health_checks import with_health

    pending = H100.replace("0, 0, 0, No, No,", "0, 0, 0, No, Yes,", 1)
    snap = with_health(
        NodeSnapshot("n", 0.0, (GpuInfo(0, "GPU-0", "H100", 0, 1, 0),)),
        parse_health(answer(pending)),
    )
    text = text_of(render_home("U0A", "ana", [snap], {}, seconds=0.1, now=0.0))
    assert "memory-repair-pending" in text
    bare = NodeSnapshot("n", 0.0, (GpuInfo(0, "GPU-0", "H100", 0, 1, 0),))  # control
    assert "memory-repair-pending" not in text_of(
        render_home("U0A", "ana", [bare], {}, seconds=0.1, now=0.0)
    )
