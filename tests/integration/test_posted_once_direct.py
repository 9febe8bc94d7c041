"""Posted once without a token: the direct posts of ``SlackApi`` (the interrupted-work report
through ``SlackReporter``, a command's answer, a progress message's update), against the
loopback fake Web API when Slack takes the post and answers ``internal_error``,
``fatal_error`` or ``service_unavailable`` (at HTTP 200, which Slack's documentation says may
follow a post it took), a 5xx, or a connection lost once the request was sent.

Such a post has no token to look for, so nothing is sent again in any form, and an update so
answered posts no new message: one line says it may not have appeared. Before, the simpler
forms, ``chat.update``'s "post anew" and slack_sdk's connection-error retry each posted it again.

The controls: a plain refusal of a post Slack did not take (``invalid_blocks``) still steps
down to the simpler form, and an update of a message Slack cannot find still posts anew.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpubot.app import build
from gpubot.config import Settings
from gpubot.core.alerting import MessageRef
from gpubot.core.ports import Report
from gpubot.slack.api import SlackApi, make_client
from gpubot.slack.blockkit import SlackMessage as Message
from gpubot.slack.blockkit import section, table
from tests.fixtures.settings import with_tables
from tests.fixtures.slack import (
    BOT_TOKEN,
    FakeSlack,
    slack_front,
)

CHANNEL = "C0GENERAL"
# (error, HTTP status) of each answer that may follow a post Slack took
MAYBE_TAKEN = [
    ("internal_error", 200),
    ("fatal_error", 200),
    ("service_unavailable", 200),
    ("internal_error", 500),
    ("service_unavailable", 503),
]


@pytest.fixture
async def api(fake_slack: FakeSlack) -> AsyncIterator[SlackApi]:
    """A SlackApi on the fake with the bot's client (its session, its retry policy)."""
    slack = SlackApi(make_client(BOT_TOKEN, fake_slack.base_url, shared_session=True))
    yield slack
    await slack.close()


def table_msg() -> Message:
    """A message with a table: three forms to step down through (table, pre, text)."""
    rows = [["user", "pid", "MiB"], ["alice", "4242", "1024"]]
    return {"text": "GPU 3", "blocks": [section("*GPU 3*"), table(rows)]}


def in_channel(fake: FakeSlack) -> list[dict[str, Any]]:
    return [m for (c, _), m in sorted(fake.messages.items()) if c == CHANNEL]


@pytest.mark.parametrize(("error", "status"), MAYBE_TAKEN)
async def test_a_post_slack_may_have_taken_is_sent_once(
    api: SlackApi,
    fake_slack: FakeSlack,
    caplog: pytest.LogCaptureFixture,
    error: str,
    status: int,
) -> None:
    fake_slack.fail("chat.postMessage", error, status=status, times=6, taken=True)
    with caplog.at_level(logging.WARNING, "gpubot.slack.api"):
        assert await api.post(CHANNEL, table_msg()) is None
    assert len(in_channel(fake_slack)) == 1  # before: 3 (table, pre, text) at HTTP 200
    assert len(fake_slack.of("chat.postMessage")) == 1
    (line,) = [r.getMessage() for r in caplog.records]
    assert "may not have appeared" in line and error in line


async def test_a_post_whose_connection_was_lost_is_sent_once(
    api: SlackApi, fake_slack: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    fake_slack.fail("chat.postMessage", "", times=3, taken=True, dropped=True)
    with caplog.at_level(logging.WARNING, "gpubot.slack.api"):
        assert await api.post(CHANNEL, table_msg()) is None
    assert len(in_channel(fake_slack)) == 1  # before: 3 (slack_sdk's two retries)
    assert len(fake_slack.of("chat.postMessage")) == 1
    assert any("may not have appeared" in r.getMessage() for r in caplog.records)


async def test_control_a_post_slack_refused_steps_down(
    api: SlackApi, fake_slack: FakeSlack
) -> None:
    fake_slack.fail("chat.postMessage", "invalid_blocks", times=1, taken=False)
    assert await api.post(CHANNEL, table_msg()) is not None
    (message,) = in_channel(fake_slack)
    calls = fake_slack.of("chat.postMessage")
    assert len(calls) == 2 and "table" not in str(calls[1].body.get("blocks"))
    assert "```" in str(message.get("blocks"))  # the table, as preformatted text


@pytest.mark.parametrize(("error", "status"), [("internal_error", 500), ("fatal_error", 200)])
async def test_an_update_that_may_have_applied_posts_nothing_new(
    api: SlackApi, fake_slack: FakeSlack, error: str, status: int
) -> None:
    handle = await api.post(CHANNEL, {"text": "⏳ asking 1 node(s) …"})
    assert handle is not None
    fake_slack.fail("chat.update", error, status=status, times=10, taken=True)
    assert await api.update(handle, table_msg()) == handle
    assert len(in_channel(fake_slack)) == 1  # before: a second message, posted anew
    assert len(fake_slack.of("chat.postMessage")) == 1


async def test_control_an_update_of_a_message_slack_cannot_find_posts_anew(
    api: SlackApi, fake_slack: FakeSlack
) -> None:
    gone = MessageRef(f"{CHANNEL}/999.000001")
    handle = await api.update(gone, table_msg())  # message_not_found
    assert handle is not None and handle != gone
    assert len(in_channel(fake_slack)) == 1


@pytest.mark.parametrize(("error", "status"), [("internal_error", 200), ("internal_error", 500)])
async def test_the_interrupted_work_report_appears_once(
    fake_slack: FakeSlack, tmp_path: Path, error: str, status: int
) -> None:
    settings = with_tables(
        Settings(database_url=f"sqlite:///{tmp_path / 'audit.db'}"),
        {"slack": {"channel": CHANNEL}},
    )
    front = slack_front(fake_slack)
    app = build(settings, {}, need_store=True, front=front)
    try:
        reporter = front.reporter(settings)
        fake_slack.fail("chat.postMessage", error, status=status, times=6, taken=True)
        report = Report("Interrupted work", "1 reset was cut short:", ("node3 GPU 1: reset",))
        await reporter.report(report)
        (message,) = in_channel(fake_slack)  # before, at HTTP 200: twice (blocks, then text)
        assert "node3 GPU 1" in str(message)
        assert len(fake_slack.of("chat.postMessage")) == 1
    finally:
        await app.close()
