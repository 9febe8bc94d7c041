"""What ``gpubot doctor`` asks Slack: ``auth.test`` (with the token's scopes, from the
``x-oauth-scopes`` response header) and, per configured channel, whether the bot is in it."""

from __future__ import annotations

from collections.abc import Sequence

from slack_sdk.web.async_client import AsyncWebClient

from gpubot.config import Settings
from gpubot.core.doctor.checks import Check
from gpubot.errors import ChatCallFailed
from gpubot.slack.api import answered, call, make_client
from gpubot.slack.doctor_checks import SlackFacts, needed_scopes, slack_checks


async def check(token: str, base_url: str, settings: Settings) -> list[Check]:
    policy = settings.policy
    channels = [c for c in (policy.channel, policy.oncall_channel) if c]
    facts = await slack_facts(token, base_url, channels)
    dms = settings.sweep.idle.enabled or settings.claims.enabled  # claims DM the queue too
    return slack_checks(facts, needed_scopes(policy, idle_dm=dms))


async def slack_facts(token: str, base_url: str, channels: Sequence[str]) -> SlackFacts:
    client = make_client(token, base_url, timeout=10)
    try:
        auth = await call(client, "auth.test")
    except ChatCallFailed as exc:
        said = exc.error if answered(exc) else f"cannot reach Slack at {base_url}: {exc.error}"
        return SlackFacts(error=said)
    header = next((v for k, v in auth.headers.items() if k.lower() == "x-oauth-scopes"), None)
    scopes = None if header is None else frozenset(s.strip() for s in str(header).split(","))
    members: dict[str, bool | str] = {}
    for channel in dict.fromkeys(channels):
        members[channel] = await _member(client, channel)
    return SlackFacts(
        team=str(auth.get("team") or ""),
        user=str(auth.get("user") or ""),
        scopes=scopes,
        channels=members,
    )


async def _member(client: AsyncWebClient, channel: str) -> bool | str:
    """Return whether the bot is in ``channel``, or why that cannot be told."""
    try:
        info = await call(client, "conversations.info", channel=channel)
    except ChatCallFailed as exc:
        if exc.error == "channel_not_found":
            return False
        if exc.error == "missing_scope":
            return "conversations.info needs channels:read (optional)"
        return exc.error if answered(exc) else f"conversations.info failed: {exc.error}"
    chan = info.get("channel")
    return bool(chan.get("is_member")) if isinstance(chan, dict) else "no channel in the answer"
