"""The ``[teams]``, ``[reports]`` and ``[idle]`` tables (GPU-hours and the reclaim ladder)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpubot.config import front_ends
from gpubot.config.validate import Validator
from gpubot.core import durations
from gpubot.core.names import LINUX_USER
from gpubot.core.usage.ladder import LadderRule
from gpubot.core.usage.report import BY, Digest, ReportSettings
from gpubot.errors import ConfigError

LADDER_KEYS = {"ladder", "remind_after", "post_after", "offer_after"}


def reports(v: Validator, raw: Mapping[str, Any]) -> ReportSettings:
    """Validate ``[teams]`` (team = [Linux users] or a user group of the front end) and
    ``[reports]`` (``digest = "mon 09:00"``, ``digest_by``, ``channel``)."""
    teams = v.table("teams", raw.get("teams", {}))
    lists: list[tuple[str, tuple[str, ...]]] = []
    groups: list[tuple[str, str]] = []
    for name, value in teams.items():
        if isinstance(value, str):
            ids = front_ends.forms(v.where, f"teams.{name}")
            if not ids.group.fullmatch(value):
                raise ConfigError(
                    f"{v.where}: teams.{name}: expected a list of Linux users or "
                    f"{ids.group_words}, got {value!r}"
                )
            groups.append((name, value))
            continue
        users = v.strings(f"teams.{name}", value)
        bad = [u for u in users if not LINUX_USER.fullmatch(u)]
        if bad:
            raise ConfigError(f"{v.where}: teams.{name}: bad Linux user name {bad[0]!r}")
        lists.append((name, tuple(users)))
    t = v.section("reports", raw.get("reports", {}), {"digest", "digest_by", "channel"}).t
    digest = None
    if t.get("digest") is not None:
        try:
            digest = Digest.parse(v.string("reports.digest", t["digest"]))
        except ValueError as exc:
            raise ConfigError(f"{v.where}: reports.digest: {exc}") from None
    by = t.get("digest_by", "team")
    if by not in BY:
        raise ConfigError(f"{v.where}: reports.digest_by: expected one of {BY}, got {by!r}")
    channel = v.channel("reports.channel", t.get("channel"))
    return ReportSettings(tuple(lists), tuple(groups), digest, str(by), channel)


def ladder(v: Validator, raw: Mapping[str, Any]) -> LadderRule:
    """Validate ``[idle]``: ``ladder`` (off by default) and each step's delay."""
    t = v.section("idle", raw.get("idle", {}), LADDER_KEYS)
    enabled = t.boolean("ladder", False)
    delays = {}
    for key, default in (("remind_after", "2h"), ("post_after", "2h"), ("offer_after", "1h")):
        try:
            delays[key] = durations.parse(t.t.get(key, default))
        except ValueError as exc:
            raise ConfigError(f"{v.where}: idle.{key}: {exc}") from None
    return LadderRule(enabled, delays["remind_after"], delays["post_after"], delays["offer_after"])
