"""Both renderers on the same neutral messages: Block Kit for Slack, text for the console.

Each message is rendered both ways, and what it holds must survive in both: the title, every
row of its table, every action, every person and every date.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from gpubot.chat import fleet_view, reset_view
from gpubot.chat.alert_digest import render_alert, render_digest_details
from gpubot.chat.alerts import render_alert_group
from gpubot.chat.home import render_home
from gpubot.chat.idle import free_button
from gpubot.chat.message import (
    NL,
    Action,
    Actions,
    Code,
    Confirm,
    Context,
    Date,
    DateStyle,
    Heading,
    Kind,
    Mention,
    Message,
    Pre,
    Section,
    Style,
    Table,
    bold,
    italic,
)
from gpubot.console.text_render import date_text, render_text
from gpubot.core.alerting import AlertGroup, AlertItem
from gpubot.core.findings import ORPHANED_VRAM, FindingKey
from gpubot.slack.blockkit import limit_problems, nested
from gpubot.slack.render import to_slack, to_view
from tests.fixtures.fleet_samples import plan_and_result, snap

AT = 1_764_590_400.0  # 2025-12-01 12:00:00 UTC
ASKED = ("Requested by ", Mention("U0ALICE"), ", approved by ", Mention("U0CAROL", "carol"))


def table_of(msg: Message) -> Table | None:
    return next((p for p in msg.body if isinstance(p, Table)), None)


def dates_of(msg: Message) -> list[Date]:
    return [s for s in msg.spans() if isinstance(s, Date)]


def handmade() -> Message:
    """A message with one of every part and span."""
    ask = Confirm("Sure?", "pid 7 ends", confirm="Yes", deny="No", style=Style.DANGER)
    body = (
        Section(
            (
                "Hello ",
                Mention("U0BOB"),
                ", see ",
                Code("x<y>"),
                NL,
                bold("now"),
                " ",
                italic("or not"),
            )
        ),
        Pre(("line one", "line <two>")),
        Table((("Node", "GPU"), ("n1", "0"), ("n2", "1"))),
        Context((("at ", Date(AT)), ("at ", Date(AT, DateStyle.TIME)))),
        Actions((Action("go", "Go", "1", Style.PRIMARY, ask), Action("stop", "Stop", "2"))),
        Heading("More"),
        Section(("review",), Action("review", "Mark reviewed", "3")),
    )
    return Message("Everything", body, "everything at once")


def alert() -> Message:
    now = datetime.fromtimestamp(AT, UTC)
    key = FindingKey("node1", 1, ORPHANED_VRAM.value, "")
    item = AlertItem(key, None, now)
    return render_alert_group(AlertGroup("node1", (item,), snap(), now))


def digest() -> AlertGroup:
    """Orphaned memory on node1 and node2 (resolved there): one digest."""
    now = datetime.fromtimestamp(AT, UTC)
    keys = [FindingKey(n, 1, ORPHANED_VRAM.value, "") for n in ("node1", "node2")]
    items = (AlertItem(keys[0], None, now), AlertItem(keys[1], None, now, now))
    return AlertGroup("orphaned GPU memory on 2 nodes", items, None, now)


def messages() -> dict[str, Message]:
    """The shared set: hand-made, and as the views make them."""
    plan, result = plan_and_result().plan, plan_and_result()
    return {
        "hand-made": handmade(),
        "node": fleet_view.render_node(snap()),
        "approval request": reset_view.render_approval_request(12, plan, "U0BOB", "bob", AT),
        "approval state": reset_view.render_approval_state(
            12, plan, "U0BOB", "bob", reset_view.Decision("approved", "U0CAROL", AT)
        ),
        "result": reset_view.render_result("Reset node1", ASKED, result),
        "alert group": alert(),
        "digest": render_alert(digest()),
        "digest details": render_digest_details(digest())[0],
        "home": render_home("U0EVE", "eve", [snap()], {}, seconds=1.0, now=AT),
        "free it": Message(None, (Actions((free_button("k", "node1", 0, "7"),)),), "free"),
    }


def slack_text(msg: Message) -> str:
    payload = to_view(msg) if msg.kind is Kind.PAGE else to_slack(msg)
    return json.dumps(payload, ensure_ascii=False)


@pytest.mark.parametrize("name", sorted(messages()))
def test_what_a_message_holds_survives_both_renderers(name: str) -> None:
    msg = messages()[name]
    blocks, text = slack_text(msg), render_text(msg)
    payload: dict[str, Any] = json.loads(blocks)
    assert limit_problems(payload, view=msg.kind is Kind.PAGE) == []
    if msg.title is not None:
        assert payload["blocks"][0] == {
            "type": "header",
            "text": {"type": "plain_text", "text": msg.title},
        }
        assert f"== {msg.title} ==" in text
    table = table_of(msg)
    if table is not None:
        cells = [
            c["text"]
            for b in payload["blocks"]
            if b["type"] == "table"
            for r in b["rows"]
            for c in r
        ]
        for row in table.rows:
            assert all(c in cells for c in row)
            if not table.lines:  # else the console prints the one text layout's lines
                assert any(all(c in line for c in row) for line in text.splitlines()), row
        assert all(line in text.splitlines() for line in table.lines)
    buttons = [
        (b["action_id"], b["value"], b["text"]["text"])
        for b in nested(payload)
        if b.get("type") == "button"
    ]
    assert buttons == [(a.id, a.value, a.label) for a in msg.actions]
    for a in msg.actions:
        assert f"[{a.label}]" in text
    for p in msg.people:
        assert f"<@{p.id}>" in blocks and f"@{p.id}" in text
        assert p.name is None or p.name in text
    for d in dates_of(msg):
        assert f"<!date^{int(d.at)}^" in blocks and date_text(d) in text


def test_the_shared_set_covers_every_kind_of_content() -> None:
    """No check above is vacuous: between them, the messages hold each kind."""
    msgs = messages().values()
    assert all(any(getattr(m, k) for m in msgs) for k in ("title", "actions", "people"))
    assert any(table_of(m) for m in msgs) and any(dates_of(m) for m in msgs)
    assert any(p.name for m in msgs for p in m.people)


def test_plain_text_is_escaped_for_slack_and_shown_whole_on_the_console() -> None:
    msg = handmade()
    assert "x&lt;y&gt;" in slack_text(msg) and "`x<y>`" in render_text(msg)
    assert "line &lt;two&gt;" in slack_text(msg) and "line <two>" in render_text(msg)
    assert "2025-12-01 12:00:00 UTC" in render_text(msg) and "12:00 UTC" in render_text(msg)
    assert "carol (@U0CAROL)" in render_text(messages()["result"])
