"""Posted once, the pure parts: slack_sdk's 5xx retry never resends a post
(``slack.api.ServerErrorRetry``), nor does its connection-error retry once the request may have
been sent (``slack.api.ConnectionErrorRetry``). A message due once whoever asks is one outbox
row: ``tests/unit/test_outbox.py``."""

from __future__ import annotations

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

from gpubot.slack.api import ConnectionErrorRetry, ServerErrorRetry


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
