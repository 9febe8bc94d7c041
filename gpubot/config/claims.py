"""``[claims]``: GPU claims and the queue, off by default.

What each setting means is in ``core.claims.rules``; every refusal is one line naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpubot.config.validate import Validator
from gpubot.core.claims.rules import ClaimSettings, GroupLimit
from gpubot.errors import ConfigError

CLAIM_KEYS = {
    "enabled",
    "max_hours",
    "max_gpus_per_user",
    "hold_minutes",
    "claim_idle_minutes",
    "intruder_grace_s",
    "free_below_mib",
    "every_s",
    "groups",
}
GROUP_KEYS = {"max_hours", "max_gpus_per_user"}
MOST_HOURS = 24.0 * 90  # a quarter of a year: longer is a typo
MOST_MINUTES = 24.0 * 60


def claims(v: Validator, raw: Mapping[str, Any]) -> ClaimSettings:
    """Validate ``[claims]``."""
    t = v.table("claims", raw.get("claims", {}))
    v.keys("claims", t, CLAIM_KEYS)
    d = ClaimSettings()
    enabled = v.boolean("claims.enabled", t.get("enabled", d.enabled))
    hours = v.seconds("claims.max_hours", t.get("max_hours", d.max_hours), MOST_HOURS)
    gpus = int(v.positive("claims.max_gpus_per_user", t.get("max_gpus_per_user", 8), integer=True))
    hold = v.seconds("claims.hold_minutes", t.get("hold_minutes", d.hold_minutes), MOST_MINUTES)
    idle = v.seconds(
        "claims.claim_idle_minutes",
        t.get("claim_idle_minutes", d.claim_idle_minutes),
        MOST_MINUTES,
        zero=True,
    )
    grace = v.seconds("claims.intruder_grace_s", t.get("intruder_grace_s", 0.0), 86400.0, zero=True)
    below = int(v.positive("claims.free_below_mib", t.get("free_below_mib", 256), integer=True))
    every = v.seconds("claims.every_s", t.get("every_s", d.every_s), 3600.0)
    groups = _groups(v, v.table("claims.groups", t.get("groups", {})))
    return ClaimSettings(enabled, hours, gpus, hold, idle, grace, below, every, groups)


def _groups(v: Validator, table: Mapping[str, Any]) -> tuple[GroupLimit, ...]:
    out: list[GroupLimit] = []
    for name, value in table.items():
        key = f"claims.groups.{name}"
        g = v.table(key, value)
        v.keys(key, g, GROUP_KEYS)
        if not g:
            raise ConfigError(f"{v.where}: {key}: expected max_hours or max_gpus_per_user")
        hours = g.get("max_hours")
        gpus = g.get("max_gpus_per_user")
        out.append(
            GroupLimit(
                name,
                None if hours is None else v.seconds(f"{key}.max_hours", hours, MOST_HOURS),
                None
                if gpus is None
                else int(v.positive(f"{key}.max_gpus_per_user", gpus, integer=True)),
            )
        )
    return tuple(out)
