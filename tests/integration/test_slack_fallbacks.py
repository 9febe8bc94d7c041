"""Messages Slack refuses for their blocks, on every path: as is → without tables → plain text.

Through the loopback fake of the Web API and its ``response_url`` endpoints. An update's
``internal_error`` steps down like ``invalid_blocks``: Slack has answered it for blocks it could
not render (table blocks with raw_text cells, soxtoby/SlackNet#246; ``markdown`` blocks,
slackapi/python-slack-sdk#1756). A post so answered may be in the channel, and is not sent again
(``test_posted_once_direct``). A ``response_url`` answers a refusal with an HTTP error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpubot.chat import fleet_view, home
from gpubot.chat.message import bold, note
from gpubot.slack.api import SlackApi, make_client
from gpubot.slack.blockkit import SlackMessage as Message
from gpubot.slack.blockkit import nested
from gpubot.slack.render import to_slack
from tests.fixtures.fleet_samples import big_fleet, snap
from tests.fixtures.slack import BOT_TOKEN, Call, FakeSlack, assert_within_limits
from tests.fixtures.slack_render import render_text, view

render_node = view(fleet_view.render_node)
render_home = view(home.render_home)


@pytest.fixture
async def api(fake_slack: FakeSlack) -> AsyncIterator[SlackApi]:
    """A SlackApi on the fake; afterwards, everything sent fitted Slack's limits."""
    yield SlackApi(make_client(BOT_TOKEN, fake_slack.base_url))
    assert_within_limits(fake_slack)


def table_msg() -> Message:
    msg = render_node(snap())
    assert has_table(msg["blocks"])
    return msg


def has_table(blocks: Any) -> bool:
    return any(o.get("type") == "table" for o in nested(blocks or []))


def kinds(calls: list[Call]) -> list[str]:
    """Name the form of each call: table, pre (blocks, no table) or text (no blocks)."""
    out = []
    for c in calls:
        blocks = c.body.get("blocks")
        out.append("table" if has_table(blocks) else "pre" if blocks else "text")
    return out


CONTENT = "alice 4242 1024 MiB python train.py --run 4242"


# --- response_url ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("error", "status"), [("invalid_blocks", 400), ("internal_error", 500)])
async def test_response_url_drops_the_table_before_the_blocks(
    api: SlackApi, fake_slack: FakeSlack, error: str, status: int
) -> None:
    fake_slack.refuse_tables("response", error, status=status)
    await api.respond(fake_slack.response_url("cmd1"), table_msg())
    calls = fake_slack.responses()
    *refused, accepted = calls
    assert refused and all(c.status == status and c.answer["error"] == error for c in refused)
    assert kinds(refused) == ["table"] * len(refused)  # a 5xx may be retried once as it is
    assert kinds([accepted]) == ["pre"] and accepted.status == 200
    assert CONTENT in str(accepted.body["blocks"]) and "```" in str(accepted.body["blocks"])
    assert accepted.body["response_type"] == "ephemeral"


async def test_response_url_falls_back_to_text_last(api: SlackApi, fake_slack: FakeSlack) -> None:
    fake_slack.fail("response", "invalid_blocks", times=2)
    await api.respond(fake_slack.response_url("cmd2"), table_msg(), ephemeral=False)
    calls = fake_slack.responses()
    assert kinds(calls) == ["table", "pre", "text"]
    assert [c.status for c in calls] == [400, 400, 200]
    assert CONTENT in calls[-1].body["text"] and calls[-1].body["response_type"] == "in_channel"


async def test_response_url_without_a_table_goes_straight_to_text(
    api: SlackApi, fake_slack: FakeSlack
) -> None:
    fake_slack.fail("response", "internal_error", status=400)
    await api.respond(
        fake_slack.response_url("cmd3"), to_slack(note("⚠ ", bold("node9"), " is not known"))
    )
    assert kinds(fake_slack.responses()) == ["pre", "text"]  # "pre": blocks without a table
    assert "node9 is not known" in fake_slack.responses()[-1].body["text"]


async def test_response_url_accepts_a_table_at_once_when_slack_does(
    api: SlackApi, fake_slack: FakeSlack
) -> None:
    await api.respond(fake_slack.response_url("cmd4"), table_msg())
    assert kinds(fake_slack.responses()) == ["table"]  # one answer of the five a URL allows


async def test_post_outside_the_channel_answers_by_response_url_without_the_table(
    api: SlackApi, fake_slack: FakeSlack
) -> None:
    fake_slack.fail("chat.postMessage", "not_in_channel")
    fake_slack.refuse_tables("response")
    url = fake_slack.response_url("cmd5")
    assert await api.post("C0SECRET", table_msg(), response_url=url) is None
    calls = fake_slack.responses()
    assert kinds(calls) == ["table", "pre"] and calls[-1].body["response_type"] == "in_channel"


# --- chat.postMessage / chat.update -------------------------------------------------------------


@pytest.mark.parametrize("error", ["invalid_blocks", "invalid_blocks_format"])
async def test_post_drops_the_table_before_the_blocks(
    api: SlackApi, fake_slack: FakeSlack, error: str
) -> None:
    fake_slack.refuse_tables("chat.postMessage", error)
    handle = await api.post("C0GENERAL", table_msg())
    calls = fake_slack.of("chat.postMessage")
    assert kinds(calls) == ["table", "pre"]
    assert calls[0].answer["error"] == error and calls[1].answer["ok"]
    assert handle == f"C0GENERAL/{calls[1].answer['ts']}" and CONTENT in str(calls[1].body)


@pytest.mark.parametrize("error", ["invalid_blocks", "internal_error"])
async def test_update_drops_the_table_then_the_blocks(
    api: SlackApi, fake_slack: FakeSlack, error: str
) -> None:
    handle = await api.post("C0GENERAL", render_text("⏳ asking 1 node(s) …"))
    fake_slack.refuse_tables("chat.update", error)
    assert await api.update(handle, table_msg()) == handle
    assert kinds(fake_slack.of("chat.update")) == ["table", "pre"]
    fake_slack.fail("chat.update", error, times=2)  # now the preformatted form fails too
    assert await api.update(handle, table_msg()) == handle
    calls = fake_slack.of("chat.update")[2:]
    assert kinds(calls) == ["table", "pre", "text"]
    assert [c.answer.get("error") for c in calls] == [error, error, None]
    assert CONTENT in calls[-1].body["text"]
    assert len(fake_slack.of("chat.postMessage")) == 1  # updated in place, never posted anew


@pytest.mark.parametrize("error", ["invalid_blocks", "invalid_blocks_format"])
async def test_a_message_without_a_table_steps_down_to_text(
    api: SlackApi, fake_slack: FakeSlack, error: str
) -> None:
    fake_slack.fail("chat.postMessage", error)
    assert await api.post("C0GENERAL", to_slack(note(bold("done")))) is not None
    calls = fake_slack.of("chat.postMessage")
    assert kinds(calls) == ["pre", "text"] and calls[1].body["text"] == "done"


async def test_an_error_that_is_not_about_blocks_is_not_retried(
    api: SlackApi, fake_slack: FakeSlack
) -> None:
    fake_slack.fail("chat.postMessage", "channel_not_found")
    assert await api.post("C0GONE", table_msg()) is None
    assert len(fake_slack.of("chat.postMessage")) == 1


# --- views.publish --------------------------------------------------------------------------------


async def test_the_home_tab_is_published_without_a_table(
    api: SlackApi, fake_slack: FakeSlack
) -> None:
    view = render_home(
        "U0ALICE", "user3", big_fleet(nodes=40, gpus=4), {"down": "refused"}, seconds=1.0, now=0.0
    )
    assert await api.publish_home("U0ALICE", view)
    (call,) = fake_slack.of("views.publish")
    assert call.answer["ok"] and not has_table(call.body["view"]["blocks"])


async def test_the_fake_refuses_a_view_with_a_table(api: SlackApi, fake_slack: FakeSlack) -> None:
    view = {"type": "home", "blocks": table_msg()["blocks"]}  # what gpubot used to publish
    assert not await api.publish_home("U0ALICE", view)
    (call,) = fake_slack.of("views.publish")
    assert call.answer["error"] == "invalid_blocks"
    fake_slack.calls.clear()  # the fixture's limit check is about what gpubot sends now
