"""``[claims]``: GPU claims and the queue, off by default; ``[maint]``: maintenance windows.

What each setting means is in ``core.claims.rules``; every refusal is one line naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpubot.config.validate import Validator, names
from gpubot.core import durations
from gpubot.core.claims.rules import ClaimSettings, GroupLimit
from gpubot.core.maint import MaintSettings
from gpubot.errors import ConfigError

CLAIM_KEYS = names(ClaimSettings)
MOST_HOURS = 24.0 * 90  # a quarter of a year: longer is a typo
MOST_MINUTES = 24.0 * 60


def claims(v: Validator, raw: Mapping[str, Any]) -> ClaimSettings:
    t = v.section("claims", raw.get("claims", {}), CLAIM_KEYS)
    d = ClaimSettings()
    return ClaimSettings(
        t.boolean("enabled", d.enabled),
        t.seconds("max_hours", d.max_hours, MOST_HOURS),
        int(t.positive("max_gpus_per_user", 8, integer=True)),
        t.seconds("hold_minutes", d.hold_minutes, MOST_MINUTES),
        t.seconds("claim_idle_minutes", d.claim_idle_minutes, MOST_MINUTES, zero=True),
        t.seconds("intruder_grace_s", 0.0, 86400.0, zero=True),
        int(t.positive("free_below_mib", 256, integer=True)),
        t.seconds("every_s", d.every_s, 3600.0),
        tuple(
            _group(v, name, g)
            for name, g in v.table("claims.groups", t.t.get("groups", {})).items()
        ),
    )


def _group(v: Validator, name: str, value: Any) -> GroupLimit:
    g = v.section(f"claims.groups.{name}", value, {"max_hours", "max_gpus_per_user"})
    if not g.t:
        raise ConfigError(f"{v.where}: {g.name}: expected max_hours or max_gpus_per_user")
    hours, gpus = g.t.get("max_hours"), g.t.get("max_gpus_per_user")
    return GroupLimit(
        name,
        None if hours is None else g.seconds("max_hours", None, MOST_HOURS),
        None if gpus is None else int(g.positive("max_gpus_per_user", None, integer=True)),
    )


def maint(v: Validator, raw: Mapping[str, Any]) -> MaintSettings:
    """``[maint] notify_before``: how long before a window its claims' holders are told (a
    duration, ``"1h"``; ``"0s"``: as it starts)."""
    t = v.section("maint", raw.get("maint", {}), {"notify_before"})
    value = t.t.get("notify_before", "1h")
    try:
        before = durations.parse(value, positive=False) if isinstance(value, str) else -1.0
    except durations.DurationError:
        before = -1.0
    if not 0 <= before <= 7 * 86400:
        raise ConfigError(
            f'{v.where}: maint.notify_before: expected a duration up to 1w like "1h" or "30m", '
            f"got {value!r}"
        )
    return MaintSettings(before)
