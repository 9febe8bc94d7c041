"""Posted once (issue 34), the pure parts: slack_sdk's 5xx retry never resends a post
(``slack.api.ServerErrorRetry``), nor does its connection-error retry once the request may have
been sent (``slack.api.ConnectionErrorRetry``), and a message due once whoever asks is one
outbox row (``AlertOutbox.publish_once``, over a real SQLite store and a scripted Slack)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey
from slack_sdk.http_retry.builtin_async_handlers import (
    AsyncConnectionErrorRetryHandler,
    AsyncServerErrorRetryHandler,
)
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState

from gpubot.core.alerting import Delivery, Lookup, Posted
from gpubot.services.alert_outbox import AlertOutbox, once_token
from gpubot.slack.api import ConnectionErrorRetry, ServerErrorRetry
from gpubot.store import Store, open_store

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
SUBJECT = "dm:claims:offer:7:node2:3:1893499200.0"
HERE = ("D0DAVE", "1.1")
ABSENT = Lookup(True)  # the history was read: not there


def answered(url: str, status: int) -> dict[str, object]:
    return {
        "state": RetryState(),
        "request": HttpRequest(method="POST", url=url, headers={}),
        "response": HttpResponse(status_code=status, headers={}),
    }


@pytest.mark.parametrize(
    ("url", "status", "retried"),
    [
        ("https://slack.com/api/chat.postMessage", 500, False),  # it may be there: never
        ("https://slack.com/api/chat.postEphemeral", 503, False),
        ("https://hooks.slack.com/commands/T1/2/x", 500, False),  # a response_url posts too
        ("https://slack.com/api/conversations.history", 500, True),  # a read: retried once
        ("https://slack.com/api/chat.update", 503, True),  # the same content again
        ("https://slack.com/api/users.info", 429, False),  # not a server error
    ],
)
async def test_a_5xx_is_retried_for_every_call_but_a_post(
    url: str, status: int, retried: bool
) -> None:
    assert await ServerErrorRetry().can_retry_async(**answered(url, status)) is retried  # type: ignore[arg-type]


async def test_control_the_stock_handler_resends_a_post() -> None:
    url = "https://slack.com/api/chat.postMessage"
    assert await AsyncServerErrorRetryHandler().can_retry_async(**answered(url, 500))  # type: ignore[arg-type]


def lost(url: str, error: Exception) -> dict[str, object]:
    return {
        "state": RetryState(),
        "request": HttpRequest(method="POST", url=url, headers={}),
        "error": error,
    }


SLACK_KEY = ConnectionKey("slack.com", 443, True, True, None, None, None, None)
NOT_CONNECTED = aiohttp.ClientConnectorError(SLACK_KEY, ConnectionRefusedError(111, "refused"))


@pytest.mark.parametrize(
    ("url", "error", "retried"),
    [
        ("https://slack.com/api/chat.postMessage", aiohttp.ServerDisconnectedError(), False),
        ("https://slack.com/api/chat.postEphemeral", aiohttp.ClientOSError(104, "reset"), False),
        ("https://hooks.slack.com/commands/T1/2/x", aiohttp.ServerDisconnectedError(), False),
        ("https://slack.com/api/chat.postMessage", NOT_CONNECTED, True),  # nothing was sent
        ("https://slack.com/api/conversations.history", aiohttp.ServerDisconnectedError(), True),
        ("https://slack.com/api/chat.update", aiohttp.ClientOSError(104, "reset"), True),
    ],
)
async def test_a_lost_connection_is_retried_for_a_post_only_if_nothing_was_sent(
    url: str, error: Exception, retried: bool
) -> None:
    handler = ConnectionErrorRetry(max_retry_count=2)
    assert await handler.can_retry_async(**lost(url, error)) is retried  # type: ignore[arg-type]


async def test_control_the_stock_connection_handler_resends_a_post() -> None:
    url = "https://slack.com/api/chat.postMessage"
    error = aiohttp.ServerDisconnectedError()
    assert await AsyncConnectionErrorRetryHandler().can_retry_async(**lost(url, error))  # type: ignore[arg-type]


class Slack:
    """Posts as scripted (else posted), and finds what ``found`` says."""

    def __init__(self, *answers: Posted, found: Lookup = ABSENT) -> None:
        self.answers = list(answers)
        self.found = found
        self.sent: list[tuple[str, datetime | None]] = []

    async def send(self, token: str, repeat_of: datetime | None) -> Posted:
        self.sent.append((token, repeat_of))
        return self.answers.pop(0) if self.answers else Posted(Delivery.POSTED, HERE)

    async def find(self, token: str, since: datetime) -> Lookup:
        return self.found


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = open_store(f"sqlite:///{tmp_path}/a.db")
    yield s
    s.close()


async def test_a_message_due_again_is_posted_once(store: Store) -> None:
    outbox, slack = AlertOutbox(store.alerts), Slack()
    assert await outbox.publish_once(SUBJECT, slack.send, slack.find, T0) is True
    later = T0 + timedelta(hours=1)  # another tick, another process, a restart: the same
    assert await outbox.publish_once(SUBJECT, slack.send, slack.find, later) is True  # there
    assert slack.sent == [(once_token(SUBJECT), None)]


async def test_control_publish_posts_each_time_it_is_asked(store: Store) -> None:
    outbox, slack = AlertOutbox(store.alerts), Slack()
    for at in (T0, T0 + timedelta(hours=1)):
        assert await outbox.publish(SUBJECT, slack.send, slack.find, at, repeat=True) == HERE
    assert len(slack.sent) == 2


async def test_a_post_left_pending_is_settled_by_the_next_caller_after_the_settle_time(
    store: Store,
) -> None:
    outbox = AlertOutbox(store.alerts)
    lost = Slack(Posted(Delivery.UNCERTAIN, why="TimeoutError"), found=Lookup(False, why="x"))
    lost.answers.append(Posted(Delivery.UNCERTAIN, why="TimeoutError"))  # the repeat too
    assert await outbox.publish_once(SUBJECT, lost.send, lost.find, T0) is False
    assert [r for _, r in lost.sent] == [None, T0]  # once more, saying it may repeat
    assert [p.node for p in await store.alerts.pending_posts(SUBJECT)] == [SUBJECT]
    soon, found = T0 + timedelta(seconds=30), Slack(found=Lookup(True, HERE))
    assert await outbox.publish_once(SUBJECT, found.send, found.find, soon) is False  # young
    late = T0 + timedelta(minutes=2)
    assert await outbox.publish_once(SUBJECT, found.send, found.find, late) is True  # adopted
    assert found.sent == [] and await store.alerts.pending_posts(SUBJECT) == []


async def test_a_pending_post_provably_absent_is_posted_again_with_its_token(
    store: Store,
) -> None:
    outbox = AlertOutbox(store.alerts)
    lost = Slack(Posted(Delivery.UNCERTAIN, why="HTTP 500"), found=Lookup(False, why="x"))
    lost.answers.append(Posted(Delivery.UNCERTAIN, why="HTTP 500"))
    await outbox.publish_once(SUBJECT, lost.send, lost.find, T0)
    absent = Slack(found=ABSENT)
    late = T0 + timedelta(minutes=2)
    assert await outbox.publish_once(SUBJECT, absent.send, absent.find, late) is True
    assert absent.sent == [(once_token(SUBJECT), None)]


async def test_a_refused_message_is_posted_by_the_next_caller_and_then_never_again(
    store: Store,
) -> None:
    outbox = AlertOutbox(store.alerts)
    refused = Slack(Posted(Delivery.REFUSED, why="ratelimited"))
    assert await outbox.publish_once(SUBJECT, refused.send, refused.find, T0) is False
    # The control (begin_once before): a refused row was "done", and the DM lost for good.
    again, soon = Slack(), T0 + timedelta(seconds=1)  # no settle time: it is not there
    assert await outbox.publish_once(SUBJECT, again.send, again.find, soon) is True
    assert again.sent == [(once_token(SUBJECT), None)]  # its own token, said once
    late = Slack()
    assert await outbox.publish_once(SUBJECT, late.send, late.find, soon) is True
    assert late.sent == []  # posted: never again


async def test_a_message_given_up_is_looked_for_then_posted_by_the_next_caller(
    store: Store,
) -> None:
    outbox = AlertOutbox(store.alerts)
    lost = Slack(Posted(Delivery.UNCERTAIN, why="HTTP 500"), found=Lookup(False, why="x"))
    lost.answers.append(Posted(Delivery.UNCERTAIN, why="HTTP 500"))
    assert await outbox.publish_once(SUBJECT, lost.send, lost.find, T0) is False
    late = T0 + timedelta(minutes=2)  # settled: the history still unreadable, given up
    assert await outbox.publish_once(SUBJECT, lost.send, lost.find, late) is False
    assert len(lost.sent) == 2 and await store.alerts.pending_posts(SUBJECT) == []
    readable = Slack(found=ABSENT)  # later: the history is read, and it is not there
    assert await outbox.publish_once(SUBJECT, readable.send, readable.find, late) is True
    assert readable.sent == [(once_token(SUBJECT), None)]
    assert await outbox.publish_once(SUBJECT, readable.send, readable.find, late) is True
    assert len(readable.sent) == 1


async def test_a_message_given_up_and_found_is_adopted_not_posted_again(store: Store) -> None:
    outbox = AlertOutbox(store.alerts)
    lost = Slack(Posted(Delivery.UNCERTAIN, why="HTTP 500"), found=Lookup(False, why="x"))
    lost.answers.append(Posted(Delivery.UNCERTAIN, why="HTTP 500"))
    await outbox.publish_once(SUBJECT, lost.send, lost.find, T0)
    late = T0 + timedelta(minutes=2)
    assert await outbox.publish_once(SUBJECT, lost.send, lost.find, late) is False  # given up
    found = Slack(found=Lookup(True, HERE))
    assert await outbox.publish_once(SUBJECT, found.send, found.find, late) is True
    assert found.sent == []
