"""The fake Slack's own limits checker: each documented limit holds at the limit, breaks past it.

The numbers are written out here again (not read from the checker) so that a typo in either
fails this test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from benchmarks.slack_limits import advice, problems

Message = dict[str, Any]


def plain(n: int) -> dict[str, str]:
    return {"type": "plain_text", "text": "x" * n}


def mrkdwn(n: int) -> dict[str, str]:
    return {"type": "mrkdwn", "text": "x" * n}


def section(n: int = 1) -> dict[str, Any]:
    return {"type": "section", "text": mrkdwn(n)}


def button(**over: Any) -> dict[str, Any]:
    return {"type": "button", "action_id": "a", "value": "v", "text": plain(1), **over}


def actions(*els: dict[str, Any]) -> Message:
    return {"blocks": [{"type": "actions", "elements": list(els)}]}


def dialog(**sizes: int) -> dict[str, Any]:
    parts = {"title": 1, "text": 1, "confirm": 1, "deny": 1, **sizes}
    return {k: plain(n) for k, n in parts.items()}


def table(rows: int, cells: int, settings: int = 0) -> Message:
    blk = {
        "type": "table",
        "rows": [[{"type": "raw_text", "text": "x"}] * cells] * rows,
        "column_settings": [{"align": "left"}] * settings,
    }
    return {"blocks": [blk]}


# (name, limit, message of size n, whether it is a Home tab view)
CASES: list[tuple[str, int, Callable[[int], Message], bool]] = [
    ("blocks in a message", 50, lambda n: {"blocks": [section()] * n}, False),
    ("blocks in a view", 100, lambda n: {"blocks": [section()] * n}, True),
    ("block_id", 255, lambda n: {"blocks": [{**section(), "block_id": "b" * n}]}, False),
    ("section text", 3000, lambda n: {"blocks": [section(n)]}, False),
    (
        "section fields",
        10,
        lambda n: {"blocks": [{"type": "section", "fields": [mrkdwn(1)] * n}]},
        False,
    ),
    (
        "section field text",
        2000,
        lambda n: {"blocks": [{"type": "section", "fields": [mrkdwn(n)]}]},
        False,
    ),
    ("header text", 150, lambda n: {"blocks": [{"type": "header", "text": plain(n)}]}, False),
    (
        "context elements",
        10,
        lambda n: {"blocks": [{"type": "context", "elements": [mrkdwn(1)] * n}]},
        False,
    ),
    (
        "context text",
        3000,
        lambda n: {"blocks": [{"type": "context", "elements": [mrkdwn(n)]}]},
        False,
    ),
    (
        "actions elements",
        25,
        lambda n: actions(*(button(action_id=f"a{i}") for i in range(n))),
        False,
    ),
    ("button text", 75, lambda n: actions(button(text=plain(n))), False),
    ("button value", 2000, lambda n: actions(button(value="v" * n)), False),
    ("button url", 3000, lambda n: actions(button(url="u" * n)), False),
    ("action_id", 255, lambda n: actions(button(action_id="a" * n)), False),
    (
        "accessory button text",
        75,
        lambda n: {"blocks": [{**section(), "accessory": button(text=plain(n))}]},
        False,
    ),
    ("confirm title", 100, lambda n: actions(button(confirm=dialog(title=n))), False),
    ("confirm text", 300, lambda n: actions(button(confirm=dialog(text=n))), False),
    ("confirm button", 30, lambda n: actions(button(confirm=dialog(confirm=n))), False),
    ("deny button", 30, lambda n: actions(button(confirm=dialog(deny=n))), False),
    ("table rows", 100, lambda n: table(n, 1), False),
    ("table cells a row", 20, lambda n: table(1, n), False),
    ("table column settings", 20, lambda n: table(1, 1, n), False),
    ("tables in a message", 1, lambda n: {"blocks": table(1, 1)["blocks"] * n}, False),
    ("message text", 40_000, lambda n: {"text": "t" * n}, False),
]


@pytest.mark.parametrize(("name", "limit", "make", "view"), CASES, ids=[c[0] for c in CASES])
def test_each_limit_holds_at_the_limit_and_breaks_past_it(
    name: str, limit: int, make: Callable[[int], Message], view: bool
) -> None:
    assert problems(make(limit), view=view) == [], name
    assert problems(make(limit + 1), view=view) != [], name


@pytest.mark.parametrize(
    "message",
    [
        {"blocks": [section(0)]},  # a text object holds 1 character at least
        {"blocks": [{"type": "header", "text": mrkdwn(5)}]},  # a header is plain_text
        actions(button(text=mrkdwn(5))),  # so is a button's text
        actions(button(confirm={**dialog(), "title": mrkdwn(5)})),  # and a dialog's title
        actions(button(action_id="a"), button(action_id="a")),  # action_ids unique in a block
        {"blocks": [{"type": "actions", "elements": []}]},
        {"blocks": [{"type": "context", "elements": []}]},
        {"blocks": [{"type": "table", "rows": [[{"type": "raw_text", "text": ""}]]}]},
        {"blocks": [{"type": "table", "rows": []}]},
        {"blocks": [{"type": "section"}]},  # neither text nor fields
    ],
)
def test_shapes_slack_refuses(message: Message) -> None:
    assert problems(message) != []


def test_a_table_never_goes_in_a_view() -> None:
    assert problems(table(1, 1)) == []
    assert problems(table(1, 1), view=True) == [
        "a table block in a view (tables render in messages only)"
    ]
    nested = {"blocks": [{"type": "section", "text": mrkdwn(1), "x": table(1, 1)["blocks"]}]}
    assert problems(nested, view=True) != []


def test_text_past_the_advised_length_is_advice_not_a_refusal() -> None:
    assert advice({"text": "t" * 4000}) == []
    assert advice({"text": "t" * 4001}) != [] and problems({"text": "t" * 4001}) == []
