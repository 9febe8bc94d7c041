"""Who is who and who may do what: Slack users → Linux users, approvers, node permissions.

Pure: group memberships (Slack user groups) are resolved by the caller and passed in.

Settings (all optional)::

    [slack]
    channel = "C0123"            # where alerts go
    oncall_channel = "C0456"     # where approval requests go (default: channel)

    [users]
    U012ABC = "alice"            # Slack user id -> Linux user
    email_local_part = true      # else: the local part of the Slack profile e-mail
    email_domains = ["example.com"]   # ... only for these domains (default: any)

    [approvals]
    approvers = ["U0ONCALL"]     # user ids
    usergroup = "S0ONCALL"       # and/or user groups (a string or a list)
    expiry_s = 900

    [permissions]                # who may reset which nodes; absent: everyone, everywhere
    "team-a" = ["U012ABC", "S0TEAMA"]   # key: a node group or node name, "*" for every node
    "*" = ["S0ADMINS"]                  # value: user ids, user group ids, or "*" for everyone
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpubot.core.models import NodeConfig
from gpubot.errors import ConfigError

SLACK_USER = re.compile(r"[UW][A-Z0-9]{2,30}")
SLACK_GROUP = re.compile(r"S[A-Z0-9]{2,30}")
SLACK_CHANNEL = re.compile(r"[CGD][A-Z0-9]{2,30}")
LINUX_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_NODE_OR_GROUP = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
DEFAULT_EXPIRY_S = 900.0
MAX_EXPIRY_S = 7 * 24 * 3600.0


@dataclass(frozen=True)
class Policy:
    """Identity, approver and permission rules, validated from the settings file."""

    users: Mapping[str, str] = field(default_factory=dict)
    email_local_part: bool = False
    email_domains: tuple[str, ...] = ()
    approvers: frozenset[str] = frozenset()
    approver_groups: tuple[str, ...] = ()
    expiry_s: float = DEFAULT_EXPIRY_S
    permissions: Mapping[str, tuple[str, ...]] | None = None  # None: no restriction
    channel: str | None = None
    oncall_channel: str | None = None

    @property
    def approval_channel(self) -> str | None:
        """Return where approval requests are posted."""
        return self.oncall_channel or self.channel

    def groups_to_resolve(self) -> tuple[str, ...]:
        """Return every Slack user group the rules mention (the caller resolves members)."""
        found = set(self.approver_groups)
        for who in (self.permissions or {}).values():
            found.update(w for w in who if SLACK_GROUP.fullmatch(w))
        return tuple(sorted(found))


def load_policy(extra: Mapping[str, Any], where: str = "<settings>") -> Policy:
    """Validate the ``[slack]``, ``[users]``, ``[approvals]`` and ``[permissions]`` tables."""
    v = _Check(where)
    slack = v.table("slack", extra.get("slack", {}))
    v.keys("slack", slack, {"channel", "oncall_channel"})
    channel = v.opt_id("slack.channel", slack.get("channel"), SLACK_CHANNEL, "a channel id (C…)")
    oncall = v.opt_id(
        "slack.oncall_channel", slack.get("oncall_channel"), SLACK_CHANNEL, "a channel id (C…)"
    )

    users_raw = v.table("users", extra.get("users", {}))
    users: dict[str, str] = {}
    email = False
    domains: tuple[str, ...] = ()
    for key, value in users_raw.items():
        if key == "email_local_part":
            if not isinstance(value, bool):
                raise ConfigError(f"{where}: users.email_local_part: expected true or false")
            email = value
        elif key == "email_domains":
            domains = tuple(d.lower() for d in v.str_list("users.email_domains", value))
        elif SLACK_USER.fullmatch(key):
            if not isinstance(value, str) or not LINUX_USER.fullmatch(value):
                raise ConfigError(
                    f"{where}: users.{key}: expected a Linux user name, got {value!r}"
                )
            users[key] = value
        else:
            raise ConfigError(
                f"{where}: users.{key}: not a Slack user id (U…/W…), email_local_part or "
                "email_domains"
            )

    appr = v.table("approvals", extra.get("approvals", {}))
    v.keys("approvals", appr, {"approvers", "usergroup", "expiry_s"})
    approvers = v.str_list("approvals.approvers", appr.get("approvers", []))
    for a in approvers:
        if not SLACK_USER.fullmatch(a):
            raise ConfigError(f"{where}: approvals.approvers: {a!r} is not a Slack user id (U…)")
    groups_raw = appr.get("usergroup", [])
    groups = v.str_list("approvals.usergroup", [groups_raw] if isinstance(groups_raw, str)
                        else groups_raw)  # fmt: skip
    for g in groups:
        if not SLACK_GROUP.fullmatch(g):
            raise ConfigError(f"{where}: approvals.usergroup: {g!r} is not a user group id (S…)")
    expiry = appr.get("expiry_s", DEFAULT_EXPIRY_S)
    if (isinstance(expiry, bool) or not isinstance(expiry, int | float)
            or not 0 < expiry <= MAX_EXPIRY_S):  # fmt: skip
        raise ConfigError(
            f"{where}: approvals.expiry_s: expected seconds > 0 and <= {MAX_EXPIRY_S:g}, "
            f"got {expiry!r}"
        )

    permissions: dict[str, tuple[str, ...]] | None = None
    if "permissions" in extra:
        permissions = {}
        for key, who in v.table("permissions", extra["permissions"]).items():
            if key != "*" and not _NODE_OR_GROUP.fullmatch(key):
                raise ConfigError(f"{where}: permissions.{key}: not a node or group name")
            ids = v.str_list(f"permissions.{key}", who)
            for w in ids:
                if w != "*" and not SLACK_USER.fullmatch(w) and not SLACK_GROUP.fullmatch(w):
                    raise ConfigError(
                        f"{where}: permissions.{key}: {w!r} is not a user id (U…), "
                        'a user group id (S…) or "*"'
                    )
            permissions[key] = tuple(ids)
    return Policy(
        users=users,
        email_local_part=email,
        email_domains=domains,
        approvers=frozenset(approvers),
        approver_groups=tuple(groups),
        expiry_s=float(expiry),
        permissions=permissions,
        channel=channel,
        oncall_channel=oncall,
    )


def linux_user(policy: Policy, user_id: str, email: str | None = None) -> str | None:
    """Return the Linux user a Slack user maps to, or None when unknown."""
    if user_id in policy.users:
        return policy.users[user_id]
    if not policy.email_local_part or not email or email.count("@") != 1:
        return None
    local, domain = email.split("@")
    if policy.email_domains and domain.lower() not in policy.email_domains:
        return None
    local = local.lower()
    return local if LINUX_USER.fullmatch(local) else None


def is_approver(policy: Policy, user_id: str, members: Mapping[str, Collection[str]]) -> bool:
    """Whether ``user_id`` is an approver (listed, or in an approver user group)."""
    if user_id in policy.approvers:
        return True
    return any(user_id in members.get(g, ()) for g in policy.approver_groups)


def may_reset(
    policy: Policy, user_id: str, node: NodeConfig, members: Mapping[str, Collection[str]]
) -> bool:
    """Whether ``user_id`` may ask for resets on ``node`` (by node name, group or ``*``)."""
    if policy.permissions is None:
        return True
    keys = ("*", node.name, *node.groups)
    for key in keys:
        for who in policy.permissions.get(key, ()):
            if who in ("*", user_id) or user_id in members.get(who, ()):
                return True
    return False


class _Check:
    def __init__(self, where: str) -> None:
        self.where = where

    def table(self, key: str, value: Any) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{self.where}: {key}: expected a table")
        return value

    def keys(self, section: str, table: Mapping[str, Any], allowed: set[str]) -> None:
        for k in table:
            if k not in allowed:
                raise ConfigError(f"{self.where}: {section}.{k}: unknown key")

    def str_list(self, key: str, value: Any) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(x, str) and x for x in value):
            raise ConfigError(f"{self.where}: {key}: expected a list of strings")
        return list(value)

    def opt_id(self, key: str, value: Any, pattern: re.Pattern[str], what: str) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise ConfigError(f"{self.where}: {key}: expected {what}, got {value!r}")
        return value
