"""The Slack adapter's one boundary map (``gpubot.slack.api.slack_errors``): slack_sdk's and
aiohttp's errors become ``ChatCallFailed`` or ``ChatUnanswered``, in the words logged before."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from slack_sdk.errors import SlackApiError, SlackClientError

from gpubot.errors import ChatCallFailed, ChatUnanswered, GpubotError, UsageError
from gpubot.slack.api import SlackDirectory, slack_errors


def refusal(code: str | None) -> SlackApiError:
    """Slack's answer ``{"ok": false, "error": code}`` as slack_sdk raises it."""
    answer = {"ok": False} if code is None else {"ok": False, "error": code}
    message = f"The request to the Slack API failed: {code}"
    return SlackApiError(message, answer)  # type: ignore[no-untyped-call]


@pytest.mark.parametrize(
    ("error", "kind", "message"),
    [
        (refusal("not_in_channel"), ChatCallFailed, "chat.postMessage: not_in_channel"),
        (refusal(None), ChatCallFailed, "chat.postMessage: unknown_error"),
        (SlackClientError("bad"), ChatCallFailed, "chat.postMessage: SlackClientError"),
        (TimeoutError(), ChatUnanswered, "chat.postMessage: TimeoutError"),
        (
            aiohttp.ServerDisconnectedError(),
            ChatUnanswered,
            "chat.postMessage: ServerDisconnectedError",
        ),
    ],
)
def test_library_errors_become_gpubots(
    error: Exception, kind: type[Exception], message: str
) -> None:
    with pytest.raises(ChatCallFailed) as got, slack_errors("chat.postMessage"):
        raise error
    assert type(got.value) is kind and str(got.value) == message
    assert got.value.__cause__ is error


@pytest.mark.parametrize("error", [UsageError("mine"), KeyError("a bug")])
def test_other_errors_pass_untouched(error: Exception) -> None:
    with pytest.raises(type(error)) as got, slack_errors("chat.update"):
        raise error
    assert got.value is error


class Refusing:
    """A Web API client every method of which Slack refuses with ``code``."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __getattr__(self, name: str) -> Any:
        async def method(**_: Any) -> Any:
            raise refusal(self.code)

        return method


@pytest.mark.parametrize(
    ("ask", "message"),
    [
        ("group_members", "usergroups.users.list: no_such_subteam"),
        ("account", "users.info: no_such_subteam"),
        ("home_team", "auth.test: no_such_subteam"),
    ],
)
async def test_the_directory_says_what_it_said_before(ask: str, message: str) -> None:
    directory = SlackDirectory(Refusing("no_such_subteam"))  # type: ignore[arg-type]
    call = getattr(directory, ask)
    with pytest.raises(GpubotError) as got:
        await (call() if ask == "home_team" else call("S0X"))
    assert str(got.value) == message and isinstance(got.value, ChatCallFailed)
