"""Slack surfaces that do not render as a message does: the Home tab and confirmation dialogs.

Rules checked here, with their sources:
- A ``table`` block renders in messages only, and a view holds at most 100 blocks
  (https://docs.slack.dev/reference/block-kit/blocks, each block's "Surfaces";
  https://docs.slack.dev/reference/block-kit/blocks/table-block).
- A confirmation dialog's ``title``, ``text``, ``confirm`` and ``deny`` are ``plain_text`` text
  objects of at most 100, 300, 30 and 30 characters
  (https://api.slack.com/reference/block-kit/composition-objects#confirm).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpubot.chat import alerts, fleet_view, home, reset_view
from gpubot.core.models import NodeSnapshot
from gpubot.core.reset.plan import ResetRequest, plan_reset
from gpubot.core.reset.protect import Protection
from tests.fixtures.fleet_samples import EVIL, big_fleet, gpu, plan_and_result, proc, snap
from tests.fixtures.slack_render import bk, orphaned_alert, view, views

fv = views(fleet_view)
rb = rv = views(reset_view)
ra = views(alerts)
render_home = view(home.render_home)

SRC = Path(__file__).resolve().parents[2] / "gpubot"


def walk(obj: Any) -> Iterator[dict[str, Any]]:
    """Yield every dict inside ``obj`` (written apart from ``bk.nested``, to check it)."""
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, dict):
            yield o
            stack.extend(o.values())
        elif isinstance(o, list):
            stack.extend(o)


def types_in(view: dict[str, Any]) -> set[str]:
    return {str(o["type"]) for o in walk(view["blocks"]) if "type" in o}


def fleet(n: int) -> list[NodeSnapshot]:
    if n == 1:
        return [snap()]
    return big_fleet(nodes=n, gpus=4)


# --- 1. the Home tab gets no table --------------------------------------------------------------


@pytest.mark.parametrize("nodes", [1, 2, 3, 4, 40, 256])
@pytest.mark.parametrize("linux_user", ["alice", "user7", None])
@pytest.mark.parametrize("failing", [0, 1, 80])
def test_home_view_has_no_table_and_fits_a_view(
    nodes: int, linux_user: str | None, failing: int
) -> None:
    snaps = fleet(nodes)
    failed = {f"down{i:02d}": "ssh: connection refused" for i in range(failing)}
    view = render_home("U0ALICE", linux_user, snaps, failed, seconds=1.5, now=1_700_000_000.0)
    assert view["type"] == "home"
    assert "table" not in types_in(view)  # not at the top level, not nested anywhere
    assert 0 < len(view["blocks"]) <= 100
    assert bk.limit_problems(view, view=True) == []
    text = bk.message_text(view)
    assert "Nodes:" in text or nodes == 1
    if nodes == 1:
        assert "alice 4242 1024 MiB python train.py --run 4242" in text  # rows as text


def test_home_view_keeps_the_rows_a_message_shows_as_a_table() -> None:
    snaps = big_fleet(nodes=40, gpus=4)
    message = fv.render_fleet(snaps, {}, seconds=1.0, title="Fleet")
    assert "table" in types_in(message)  # the message does use a table: the check means something
    table = next(b for b in message["blocks"] if b["type"] == "table")
    view = render_home("U0ALICE", None, snaps, {}, seconds=1.0, now=0.0)
    text = bk.message_text(view)
    for row in table["rows"][1:]:
        node, busy = row[0]["text"], row[1]["text"]
        assert re.search(rf"{node}\s+{re.escape(busy)}\s", text), node
    assert "```" in str(view)  # as preformatted section text


def test_one_node_home_view_has_the_gpu_rows_as_text() -> None:
    view = render_home("U0ALICE", "alice", [snap()], {}, seconds=0.2, now=0.0)
    assert "table" not in types_in(view)
    text = bk.message_text(view)
    assert re.search(r"(?m)^\s+0\s+2048 / 81920\s", text)
    assert "Your processes" in text and "node1 GPU 0: alice 4242" in text


def test_the_view_check_finds_a_nested_table() -> None:
    tbl = bk.table([["a", "b"], ["1", "2"]])
    top = {"blocks": [bk.section("x"), tbl]}
    deep = {"blocks": [{"type": "container", "elements": [{"type": "x", "child": tbl}]}]}
    for shown in (top, deep):
        assert any("table block in a view" in p for p in bk.limit_problems(shown, view=True))
    assert bk.limit_problems(top) == []  # a message may carry one
    many = {"blocks": [bk.section("x")] * 101}
    assert any("101 blocks > 100" in p for p in bk.limit_problems(many, view=True))
    assert bk.limit_problems({"blocks": [bk.section("x")] * 100}, view=True) == []


# --- 2. confirmation dialogs are plain_text -----------------------------------------------------


def dialogs(msg: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        o["confirm"]
        for o in walk(msg["blocks"])
        if isinstance(o.get("confirm"), dict) and "title" in o["confirm"]
    ]


def check_dialog(d: dict[str, Any]) -> None:
    for part, most in (("title", 100), ("text", 300), ("confirm", 30), ("deny", 30)):
        assert d[part]["type"] == "plain_text", part
        assert 0 < len(d[part]["text"]) <= most, part
    assert set(d) <= {"title", "text", "confirm", "deny", "style"}
    assert d.get("style") in (None, "primary", "danger")


def huge_plan() -> Any:
    procs = tuple(
        proc(1000 + i, i % 8, f"user-with-a-long-name-{i}", command=EVIL * 20) for i in range(500)
    )
    s = NodeSnapshot("n" * 60, 0.0, tuple(gpu(i, 5000) for i in range(8)), procs)
    return plan_reset(s, ResetRequest("n" * 60, "alice"), Protection())


def evil_plan() -> Any:
    s = NodeSnapshot(
        "node1", 0.0, (gpu(0, 5000),), (proc(4243, 0, "<!channel>&bob", command=EVIL),)
    )
    return plan_reset(s, ResetRequest("node1", "alice"), Protection())


@pytest.mark.parametrize(
    "plan", [plan_and_result().plan, huge_plan(), evil_plan()], ids=["plain", "huge", "evil"]
)
def test_every_confirm_dialog_of_an_approval_request_is_plain_text(plan: Any) -> None:
    msg = rb.render_approval_request(7, plan, "U0BOB", "bob", 1_700_000_900.0)
    found = dialogs(msg)
    assert len(found) == 1  # the Approve button's
    for d in found:
        check_dialog(d)
    assert bk.confirm_problems(msg["blocks"]) == [] and bk.limit_problems(msg) == []


def test_a_plain_text_dialog_carries_raw_text() -> None:
    (d,) = dialogs(rb.render_approval_request(7, evil_plan(), "U0BOB", "bob", 0.0))
    assert "<!channel>&bob" in d["text"]["text"]  # plain_text is not parsed: no escaping
    assert "&amp;" not in d["text"]["text"] and "&lt;" not in d["text"]["text"]


def test_other_messages_with_buttons_carry_no_dialog_that_breaks_the_rules() -> None:
    plan = plan_and_result().plan
    for msg in (
        ra.render_alert_group(orphaned_alert()),
        rb.render_approval_state(
            7, plan, "U0BOB", "bob", reset_view.Decision("denied", "U0C", 1.0)
        ),
        rb.render_progress("Reset", "x", plan, []),
        rb.render_result("Reset", "x", plan_and_result()),
    ):
        for d in dialogs(msg):
            check_dialog(d)
        assert bk.confirm_problems(msg["blocks"]) == []


def test_the_dialog_check_catches_mrkdwn_and_long_parts() -> None:
    old = {
        "type": "button",
        "confirm": {
            "title": {"type": "plain_text", "text": "Sure?"},
            "text": {"type": "mrkdwn", "text": "*really*"},
            "confirm": {"type": "plain_text", "text": "x" * 31},
            "deny": {"type": "plain_text", "text": "No"},
        },
    }
    problems = bk.limit_problems({"blocks": [{"type": "actions", "elements": [old]}]})
    assert "confirm dialog: text is not a plain_text object" in problems
    assert "confirm dialog: confirm not 1-30 characters" in problems


def test_confirm_dialog_clips_every_part() -> None:
    d = bk.confirm_dialog("t" * 200, "x" * 500, confirm="c" * 40, deny="", style="danger")
    check_dialog(d)
    assert d["style"] == "danger" and d["text"]["text"].endswith("…")


def test_every_confirm_object_in_the_slack_front_end_is_built_by_confirm_dialog() -> None:
    """A confirm object written by hand could slip past the tests above: there is none."""
    found = []
    for path in sorted([*(SRC / "chat").glob("*.py"), *(SRC / "slack").glob("*.py")]):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"""["']confirm["'](\s*:|\] =)""", line):
                found.append((path.name, n, line.strip()))
    outer = [f for f in found if f[0] != "blockkit.py"]  # blockkit.py: confirm_dialog itself
    assert outer and all("confirm_dialog(" in line for _, _, line in outer), outer
