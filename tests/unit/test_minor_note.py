"""The note for GPUs whose device minor is unknown: built once (core.flags), shown everywhere."""

from __future__ import annotations

import json

from gpubot.chat.fleet_view import render_node
from gpubot.cli.render import WIDTH, render_snapshot, snapshot_dict
from gpubot.core.flags import node_notes
from gpubot.core.models import GpuInfo, NodeSnapshot
from gpubot.core.text_table import node_text
from gpubot.slack.render import to_slack


def snap(*minors: int | None, notes: tuple[str, ...] = ()) -> NodeSnapshot:
    gpus = tuple(
        GpuInfo(i, f"GPU-{i}", "NVIDIA A100", 0, 40960, 0, f"00000000:{i + 1:02x}:00.0", m)
        for i, m in enumerate(minors)
    )
    return NodeSnapshot("node3", 1.0, gpus, notes=notes)


def test_no_note_when_every_minor_is_known() -> None:
    s = snap(1, 0, notes=("partial view: x",))
    assert node_notes(s) == ("partial view: x",)


def test_the_note_names_the_gpus_and_what_cannot_be_seen() -> None:
    (one,) = node_notes(snap(0, None))
    assert one.startswith("device file unknown for GPU 1: ")
    for words in ("cannot see who holds that device file", "hidden", "a reset cannot find"):
        assert words in one
    (two,) = node_notes(snap(None, 0, None))
    assert two.startswith("device file unknown for GPUs 0, 2: ")
    assert node_notes(snap(None, notes=("lost GPU",)))[0] == "lost GPU"  # the node's own first


def test_every_renderer_shows_the_note_whole() -> None:
    s = snap(0, None)
    (note,) = node_notes(s)
    lines = render_snapshot(s)[2 + len(s.gpus) :]  # after the title, header and GPU rows
    assert lines[0].startswith("⚠ ") and all(len(line) <= WIDTH for line in lines)
    shown = " ".join(line.strip().removeprefix("⚠ ") for line in lines)
    assert note in shown  # wrapped, never cut
    assert snapshot_dict(s)["notes"] == [note]
    assert lines == node_text(s)[2 + len(s.gpus) :]  # the one text layout
    assert note in json.dumps(to_slack(render_node(s))["blocks"])
