"""``gpubot doctor``'s Slack checks: the token, its scopes against what the settings use, the
bot in the channels. Facts in (``slack.doctor.slack_facts``), ``Check`` lines out (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpubot.core.doctor.checks import Check, failed, passed
from gpubot.core.policy import Policy

BASE_SCOPES = ("commands", "chat:write", "users:read")  # every bot needs these


def needed_scopes(policy: Policy, *, idle_dm: bool) -> dict[str, str]:
    """Return each Slack scope the settings use, with the setting that uses it."""
    need = {s: "every bot" for s in BASE_SCOPES}
    if policy.channel:
        need["channels:history"] = "[slack] channel (an alert is posted once)"
    if policy.groups_to_resolve():
        need["usergroups:read"] = "an approver or permission user group (S…)"
    if policy.email_local_part:
        need["users:read.email"] = "[users] email_local_part"
    if idle_dm:
        need["im:write"] = "the direct message an idle holder's owner gets ([sweep] idle_hours)"
    return need


@dataclass(frozen=True)
class SlackFacts:
    """What Slack said: ``auth.test``'s answer, its granted scopes, and channel membership."""

    error: str | None = None  # auth.test's error (invalid_auth, a network failure); None: ok
    team: str = ""
    user: str = ""
    scopes: frozenset[str] | None = None  # the x-oauth-scopes header; None: not sent
    # channel id -> True (a member), False (not), or the reason it could not be told
    channels: Mapping[str, bool | str] = field(default_factory=dict)


def slack_checks(facts: SlackFacts, need: Mapping[str, str]) -> list[Check]:
    area = "slack"
    if facts.error is not None:
        return [
            failed(
                area,
                "token valid",
                f"auth.test: {facts.error}",
                "set SLACK_BOT_TOKEN to the bot token (xoxb-…) from OAuth & Permissions",
            )
        ]
    checks = [passed(area, "token valid", f"{facts.user} in {facts.team}".strip())]
    if facts.scopes is None:
        checks.append(failed(area, "scopes", "Slack sent no x-oauth-scopes", "check SLACK_API_URL"))
    else:
        lacking = [s for s in need if s not in facts.scopes]
        if lacking:
            uses = "; ".join(f"{s} ({need[s]})" for s in lacking)
            checks.append(
                failed(
                    area,
                    "scopes",
                    f"the token lacks {uses}",
                    f"add {', '.join(lacking)} under OAuth & Permissions → Scopes, then "
                    "reinstall the app",
                )
            )
        else:
            checks.append(passed(area, "scopes", ", ".join(sorted(need))))
    for channel, member in facts.channels.items():
        name = f"bot in {channel}"
        if member is True:
            checks.append(passed(area, name))
        elif member is False:
            checks.append(failed(area, name, "not a member", f"/invite @gpubot in {channel}"))
        else:
            checks.append(passed(area, name, f"not checked: {member}"))
    return checks
