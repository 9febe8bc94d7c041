"""The one text layout (``gpubot.core.text_table``): cuts at the end, alignment, the summary's
reasons, and the layout the console and ``gpubot status`` share."""

from __future__ import annotations

import pytest

from gpubot.chat import fleet_view
from gpubot.cli.render import render_snapshot
from gpubot.console.text_render import render_text
from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.text import cut
from gpubot.core.text_table import gpu_lines, summary_lines, summary_rows, table_lines

LONG = "/opt/conda/envs/train/bin/python /home/bob/projects/llm/train.py --config big.yaml"


def gpu(i: int, used: int | None = 1024) -> GpuInfo:
    return GpuInfo(i, f"GPU-{i}", "NVIDIA H100", used, 81920, 50, f"00000000:0{i}:00.0", i)


def proc(pid: int, g: int, cmd: str = LONG, user: str = "bob") -> GpuProcess:
    return GpuProcess(
        pid, g, 512, "python", True, True, user, state="S", start_ticks=1, command=cmd, uid=1000
    )


def snap(node: str = "n1") -> NodeSnapshot:
    return NodeSnapshot(node, 0.0, (gpu(0), gpu(1, None)), (proc(7, 0), proc(8, 0, "sleep 1")))


def test_cut_keeps_the_start_and_marks_the_end() -> None:
    assert cut("abcdef", 6) == "abcdef" and cut("abcdefg", 6) == "abcde…"


def test_columns_align_and_long_cells_are_cut_at_their_end() -> None:
    lines = table_lines([["A", "B"], ["1", "x" * 10], ["22", "y"]], right=(0,), most={1: 5})
    assert lines == [" A  B", " 1  xxxx…", "22  y"]


def test_a_gpu_row_cuts_the_command_at_its_end_and_labels_memory_percent() -> None:
    head, first, second, unknown = gpu_lines(snap())
    assert "MEM %" in head and first[head.index("MEM %") :].startswith("   1%")
    cell = first[head.index("PROCESSES") :].split("  ")[0]
    assert cell.startswith("bob 7 512 MiB python /home/bob/projects/") and cell.endswith("…")
    assert second.lstrip().startswith("bob 8 512 MiB sleep 1")  # its own line, GPU cells blank
    assert unknown.split()[:4] == ["1", "?", "/", "81920"]


def test_the_console_and_the_cli_print_the_same_table() -> None:
    s = snap()
    cli = render_snapshot(s)
    console = render_text(fleet_view.render_node(s)).splitlines()
    assert cli[1:5] == console[1:5] == gpu_lines(s)


def test_the_summary_names_why_each_node_did_not_answer() -> None:
    failed = {"n2": "no answer in 20s", "n3": "cannot connect", "n4": "nvidia-smi hung"}
    rows = summary_rows(
        [snap()], failed, slow=("n2",), unreachable=("n3",), order=["n4", "n1", "n3", "n2"]
    )
    assert [r[0] for r in rows[1:]] == ["n4", "n1", "n3", "n2"]
    assert [r[5] for r in rows[1:]] == [
        "failed: nvidia-smi hung",
        "ok",
        "unreachable: cannot connect",
        "slow: no answer in 20s",
    ]
    n1 = rows[2]
    assert n1[1:5] == ["1/2", "1.0 / 160.0?", "1 memory-unknown", "2"]  # "?": a GPU unknown
    assert len(summary_lines(rows)) == 5


WIDER = LONG + " --lr 3e-4" * 30  # longer than any terminal's line


def processes_cell(lines: list[str]) -> str:
    """Return the first GPU row's processes cell (the column starts under its header)."""
    head, first = lines[0], lines[1]
    return first[head.index("PROCESSES") :].split("  ")[0]


@pytest.mark.parametrize("width", [80, 120, 160, 250])
def test_the_command_column_takes_the_terminal_s_width(width: int) -> None:
    s = NodeSnapshot("n1", 0.0, (gpu(0), gpu(1, None)), (proc(7, 0, WIDER), proc(8, 1, "sleep 1")))
    today = gpu_lines(s)  # width unknown (a pipe): the fixed limit
    lines = gpu_lines(s, width=width)
    if width <= max(map(len, today)):  # 80: no room to grow, today's lines as they were
        assert lines == today
    else:
        assert max(map(len, lines)) <= width  # the widest line fills the terminal, no more
        assert max(map(len, lines)) >= width - 1
        assert len(processes_cell(lines)) > len(processes_cell(today))
    cell = processes_cell(lines)
    assert cell.startswith("bob 7 512 MiB python /home/bob/projects/") and cell[-1] == "…"


def test_wider_terminals_show_more_of_each_command() -> None:
    s = NodeSnapshot("n1", 0.0, (gpu(0),), (proc(7, 0, WIDER),))
    shown = [len(processes_cell(gpu_lines(s, width=w))) for w in (80, 120, 160, 250)]
    assert shown == sorted(shown) and len(set(shown[1:])) == 3  # 120 < 160 < 250
    assert gpu_lines(s, width=None) == gpu_lines(s, width=80)  # unknown: as on 80 columns


def test_the_cli_passes_the_width_down() -> None:
    s = NodeSnapshot("n1", 0.0, (gpu(0),), (proc(7, 0, WIDER),))
    assert render_snapshot(s, width=160)[1:] == gpu_lines(s, width=160)
    assert render_snapshot(s)[1:] == gpu_lines(s)
