"""The policy and sweep tables: the primary front end's section (its channels), ``[users]``,
``[approvals]``, ``[permissions]`` (``Settings.policy``), ``[sweep]``, ``[alerts]``
(``Settings.sweep``), ``[metrics]``, ``[cli]``.

What each setting means: ``gpubot.core.policy`` and ``gpubot.core.findings``. The ids of people,
groups and channels are the primary front end's, checked by its forms (``front_ends``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gpubot.config import front_ends
from gpubot.config.settings import CliSettings, MetricsSettings
from gpubot.config.validate import Table, Validator, check_port
from gpubot.core import durations
from gpubot.core.findings import SweepConfig
from gpubot.core.names import LINUX_USER, NODE_NAME
from gpubot.core.policy import DEFAULT_EXPIRY_S, DEFAULT_GROUP_CACHE_S, DEFAULT_MIN_UID, Policy
from gpubot.core.usage.idle import DEFAULT_KEEP_S, IdleRule
from gpubot.errors import ConfigError

DOMAIN = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+")
MAX_EXPIRY_S = 7 * 24 * 3600.0  # [approvals] expiry_s
MAX_UID = 2**31 - 1  # [users] min_uid
MAX_GROUP_CACHE_S = 3600.0  # [approvals] group_cache_s


# --- the front end's channels, [users] [approvals] [permissions]: the policy -----------------


def channels(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """Return the primary front end's section (its channels); empty when it has none."""
    known = front_ends.primary()
    section = {} if known is None else raw.get(known.name, {})
    return section if isinstance(section, Mapping) else {}


def policy(v: Validator, raw: Mapping[str, Any], system_users: tuple[str, ...]) -> Policy:
    """Validate the front end's channels, ``[users]``, ``[approvals]`` and ``[permissions]``."""
    known = front_ends.primary()
    channel = oncall = None
    if known is not None:
        section = v.section(known.name, raw.get(known.name, {}), {"channel", "oncall_channel"}).t
        channel = v.channel(f"{known.name}.channel", section.get("channel"))
        oncall = v.channel(f"{known.name}.oncall_channel", section.get("oncall_channel"))
    users = _users(v, raw)
    appr = v.section(
        "approvals",
        raw.get("approvals", {}),
        {"approvers", "usergroup", "expiry_s", "group_cache_s"},
    )
    approvers = appr.strings("approvers", [])
    for a in approvers:
        if not front_ends.is_person(a):
            words = front_ends.person_words(v.where, "approvals.approvers")
            raise ConfigError(f"{v.where}: approvals.approvers: {a!r} is not {words}")
    groups_raw = appr.t.get("usergroup", [])
    groups = v.strings(
        "approvals.usergroup", [groups_raw] if isinstance(groups_raw, str) else groups_raw
    )
    for g in groups:
        if not (ids := front_ends.forms(v.where, "approvals.usergroup")).group.fullmatch(g):
            raise ConfigError(f"{v.where}: approvals.usergroup: {g!r} is not {ids.group_words}")
    expiry = appr.seconds("expiry_s", DEFAULT_EXPIRY_S, MAX_EXPIRY_S)
    cache = appr.seconds("group_cache_s", DEFAULT_GROUP_CACHE_S, MAX_GROUP_CACHE_S, zero=True)
    permissions, permission_groups = _permissions(v, raw)
    return replace(
        users,
        channel=channel,
        oncall_channel=oncall,
        approvers=frozenset(approvers),
        approver_groups=groups,
        expiry_s=expiry,
        group_cache_s=cache,
        permissions=permissions,
        permission_groups=permission_groups,
        system_users=tuple(system_users),
        bots=frozenset() if known is None else known.bots,
    )


USERS_KEYS = ("email_local_part", "email_domains", "min_uid")


def _users(v: Validator, raw: Mapping[str, Any]) -> Policy:
    """Validate the ``[users]`` table (the rest of the policy left at its defaults)."""
    t = v.table("users", raw.get("users", {}))
    users: dict[str, str] = {}
    for key, value in t.items():
        if key in USERS_KEYS:
            continue
        if not front_ends.is_person(key):
            raise ConfigError(
                f"{v.where}: users.{key}: not {front_ends.person_words(v.where, f'users.{key}')}"
                ", email_local_part, email_domains or min_uid"
            )
        if not isinstance(value, str) or not LINUX_USER.fullmatch(value):
            raise ConfigError(f"{v.where}: users.{key}: expected a Linux user name, got {value!r}")
        users[key] = value
    u = Table(v, "users", t)
    email = u.boolean("email_local_part", False)
    domains = tuple(d.lower() for d in u.strings("email_domains", []))
    for d in domains:
        if not DOMAIN.fullmatch(d):
            raise ConfigError(
                f"{v.where}: users.email_domains: {d!r} is not a domain (e.g. example.com)"
            )
    if email and not domains:
        raise ConfigError(
            f"{v.where}: users.email_local_part: needs users.email_domains (the domains whose "
            "addresses are your Linux users): otherwise any profile e-mail picks a Linux user"
        )
    min_uid = t.get("min_uid", DEFAULT_MIN_UID)
    if isinstance(min_uid, bool) or not isinstance(min_uid, int) or not 0 <= min_uid <= MAX_UID:
        raise ConfigError(
            f"{v.where}: users.min_uid: expected a uid from 0 to {MAX_UID}, got {min_uid!r}"
        )
    return Policy(users=users, email_local_part=email, email_domains=domains, min_uid=min_uid)


def _permissions(
    v: Validator, raw: Mapping[str, Any]
) -> tuple[dict[str, tuple[str, ...]] | None, frozenset[str]]:
    """Validate ``[permissions]``: the rules (None when absent: no restriction) and the user
    groups they name."""
    if "permissions" not in raw:
        return None, frozenset()
    out: dict[str, tuple[str, ...]] = {}
    groups: set[str] = set()
    for key, who in v.table("permissions", raw["permissions"]).items():
        if key != "*" and not NODE_NAME.fullmatch(key):
            raise ConfigError(f"{v.where}: permissions.{key}: not a node or group name")
        ids = v.strings(f"permissions.{key}", who)
        for w in ids:
            forms = front_ends.forms(v.where, f"permissions.{key}") if w != "*" else None
            if forms is not None and forms.group.fullmatch(w):
                groups.add(w)
            elif forms is not None and not front_ends.is_person(w):
                words = front_ends.person_words(v.where, f"permissions.{key}")
                raise ConfigError(
                    f"{v.where}: permissions.{key}: {w!r} is not {words}, "
                    f'{forms.group_words} or "*"'
                )
        out[key] = ids
    return out, frozenset(groups)


# --- [sweep] [alerts] [metrics] ------------------------------------------------------------------

SWEEP_KEYS = {
    "interval_s",
    "budget_s",
    "orphan_threshold_mib",
    "idle_min_mib",
    "idle_hours",
    "health",
    "keep_samples",
    "kernel_log",
    "xid_window_s",
    "hung_sweeps",
}


def sweep(v: Validator, raw: Mapping[str, Any]) -> SweepConfig:
    """Validate the ``[sweep]`` and ``[alerts]`` tables (alerts go to the front end's channel
    too)."""
    sweep = v.table("sweep", raw.get("sweep", {}))
    if "idle_holder" in sweep:
        raise ConfigError(
            f"{v.where}: sweep.idle_holder: replaced by sweep.idle_min_mib, sweep.idle_hours "
            '(0: off) and sweep.keep_samples (e.g. "14d"); remove the [sweep.idle_holder] table'
        )
    t = v.section("sweep", sweep, SWEEP_KEYS)
    interval = t.positive("interval_s", 300.0)
    budget = t.positive("budget_s", round(interval * 0.8, 3))
    if budget > interval:
        raise ConfigError(
            f"{v.where}: sweep.budget_s: {budget:g} is longer than sweep.interval_s ({interval:g})"
        )
    orphan = t.positive("orphan_threshold_mib", 1024, integer=True, zero=True)
    idle = _idle_rule(t)
    alerts = v.section("alerts", raw.get("alerts", {}), {"channel", "reminder_s"})
    reminder = alerts.positive("reminder_s", 21600.0)
    channel = alerts.t.get("channel", channels(raw).get("channel"))  # validated with the policy
    return SweepConfig(
        interval,
        budget,
        int(orphan),
        idle,
        reminder,
        v.channel("alerts.channel", channel),
        health=t.boolean("health", True),
        kernel_log=t.boolean("kernel_log", False),
        xid_window_s=t.positive("xid_window_s", 3600.0),
        hung_sweeps=int(t.positive("hung_sweeps", 3, integer=True, zero=True)),
    )


def _idle_rule(t: Table) -> IdleRule:
    v = t.v
    min_mib = t.positive("idle_min_mib", IdleRule.min_mib, integer=True)
    hours = t.positive("idle_hours", IdleRule.hours, zero=True)
    keep_raw = t.t.get("keep_samples")
    keep = DEFAULT_KEEP_S
    if keep_raw is not None:
        try:
            keep = durations.parse(keep_raw)
        except ValueError as exc:
            raise ConfigError(f"{v.where}: sweep.keep_samples: {exc}") from None
    rule = IdleRule(int(min_mib), hours, keep)
    if rule.enabled and keep < rule.window_s:
        raise ConfigError(
            f"{v.where}: sweep.keep_samples: {keep_raw} is shorter than sweep.idle_hours "
            f"({hours:g} h): no GPU could ever be seen idle that long"
        )
    return rule


def metrics(v: Validator, raw: Mapping[str, Any]) -> MetricsSettings:
    t = v.section("metrics", raw.get("metrics", {}), {"port", "host"}).t
    port = t.get("port")
    if port is not None:
        port = check_port(port, f"{v.where}: metrics.port")
    host = t.get("host", "127.0.0.1")
    if not isinstance(host, str) or not host:
        raise ConfigError(f"{v.where}: metrics.host: expected an address, got {host!r}")
    return MetricsSettings(port, host)


def cli(v: Validator, raw: Mapping[str, Any]) -> CliSettings:
    t = v.section("cli", raw.get("cli", {}), {"summary_above"})
    return CliSettings(int(t.positive("summary_above", 8, integer=True, zero=True)))
