"""The lines that name interrupted work (``core.reset.interrupted``) and their chat blocks."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpubot.chat.interrupted import ACTION_REVIEW, MAX_SHOWN, Interrupted, interrupted_parts
from gpubot.core.reset.interrupted import interrupted_dict, interrupted_line, interrupted_lines
from gpubot.slack.render import to_block


@dataclass(frozen=True)
class Cut:
    id: int
    actor: str = "cli:alice"
    kind: str = "reset"
    node: str | None = "node1"
    command: str = "gpubot reset node1 --gpu 0"
    started_at: datetime = datetime(2026, 3, 4, 5, 6, 7, 890, tzinfo=UTC)


def test_one_line_names_what_who_when_and_where_to_look() -> None:
    assert interrupted_line(Cut(12)) == (
        "reset #12 on node1 by cli:alice at 2026-03-04 05:06:07 UTC never finished: "
        "`gpubot audit show 12`"
    )
    assert interrupted_line(Cut(3, kind="", node=None)).startswith("action #3 on - by ")


def test_lines_end_with_how_to_stop_seeing_them_and_none_means_nothing() -> None:
    assert interrupted_lines([]) == []
    lines = interrupted_lines([Cut(12), Cut(9)])
    assert len(lines) == 3 and lines[-1].endswith("`gpubot audit review 12 9`")


def test_json_form() -> None:
    d = interrupted_dict(Cut(12))
    assert d["id"] == 12 and d["started_at"] == "2026-03-04T05:06:07Z"
    assert d["show"] == "gpubot audit show 12" and d["review"] == "gpubot audit review 12"
    assert d["line"] == interrupted_line(Cut(12))


def interrupted_blocks(found: Interrupted | None, *, buttons: bool) -> list[dict[str, Any]]:
    """Return the parts as Slack's blocks."""
    return [to_block(p) for p in interrupted_parts(found, buttons=buttons)]


def test_blocks_escape_names_and_offer_the_button_only_to_approvers() -> None:
    hostile = Cut(7, actor="<!channel> *bold*")
    text = json.dumps(interrupted_blocks(Interrupted((hostile,), may_review=True), buttons=True))
    assert "<!channel>" not in text and "&lt;!channel&gt;" in text
    assert ACTION_REVIEW in text and '"value": "7"' in text
    plain = interrupted_blocks(Interrupted((hostile,), may_review=False), buttons=True)
    assert ACTION_REVIEW not in json.dumps(plain)
    assert interrupted_blocks(None, buttons=True) == []
    assert interrupted_blocks(Interrupted(()), buttons=True) == []


def test_many_are_counted_not_listed() -> None:
    many = Interrupted(tuple(Cut(i) for i in range(1, MAX_SHOWN + 4)), may_review=True)
    blocks = interrupted_blocks(many, buttons=True)
    assert len(blocks) == 1 + MAX_SHOWN + 1
    assert "… and 3 more: `gpubot audit list --incomplete`" in json.dumps(
        blocks, ensure_ascii=False
    )
