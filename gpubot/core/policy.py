"""Who is who and who may do what: chat accounts → Linux users, approvers, node permissions.

Pure: group memberships are resolved by the caller and passed in. Every id in the settings
(``[users]``, ``[approvals]``, ``[permissions]``; see ``gpubot.example.toml``) is the primary
front end's, checked by its forms (``config.front_ends``).

Who may use gpubot at all (``resolve``): never a guest, an account of another workspace, a
deleted account or a bot; and a mapping to ``root`` or a system account (``[reset]
system_users``) is refused, never used. A process below ``min_uid`` is never self-service.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from gpubot.core.models import NodeConfig
from gpubot.core.names import LINUX_USER
from gpubot.core.reset.plan import ResetPlan
from gpubot.core.reset.protect import DEFAULT_SYSTEM_USERS

DEFAULT_EXPIRY_S = 900.0
DEFAULT_MIN_UID = 1000
DEFAULT_GROUP_CACHE_S = 60.0


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
    min_uid: int = DEFAULT_MIN_UID
    group_cache_s: float = DEFAULT_GROUP_CACHE_S
    bots: frozenset[str] = frozenset()  # the chat system's own bot accounts: never mapped
    permission_groups: frozenset[str] = frozenset()  # the user groups [permissions] names
    system_users: tuple[str, ...] = DEFAULT_SYSTEM_USERS  # [reset] system_users: never mapped to

    def chat_ids(self) -> dict[str, tuple[str, ...]]:
        """Return Linux user → the chat user ids ``[users]`` maps to it (sorted): whom a
        message about a Linux user's processes goes to."""
        out: dict[str, list[str]] = {}
        for chat_id, linux in self.users.items():
            out.setdefault(linux, []).append(chat_id)
        return {linux: tuple(sorted(ids)) for linux, ids in out.items()}

    @property
    def approval_channel(self) -> str | None:
        """Return where approval requests are posted."""
        return self.oncall_channel or self.channel

    def groups_to_resolve(self) -> tuple[str, ...]:
        """Return every user group the rules mention (the caller resolves members)."""
        return tuple(sorted({*self.approver_groups, *self.permission_groups}))


def linux_user(policy: Policy, user_id: str, email: str | None = None) -> str | None:
    """Return the Linux user a chat user maps to, or None when unknown."""
    if user_id in policy.users:
        return policy.users[user_id]
    if not policy.email_local_part or not email or email.count("@") != 1:
        return None
    local, domain = email.split("@")
    if domain.lower() not in policy.email_domains:  # no domains: no e-mail mapping at all
        return None
    local = local.lower()
    return local if LINUX_USER.fullmatch(local) else None


@dataclass(frozen=True)
class ChatAccount:
    """What the chat system says of an account, in its front end's words mapped to these."""

    id: str
    team_id: str | None = None  # the workspace (organisation) it belongs to
    email: str | None = None
    deleted: bool = False
    bot: bool = False
    guest: bool = False  # a guest of the workspace, whatever its kind
    stranger: bool = False  # seen through a shared channel, of another organisation


@dataclass(frozen=True)
class Person:
    """A person talking to gpubot: their chat id (the front end's reference), display name,
    Linux user (None: unknown), and why they may not use gpubot at all (None: they may)."""

    id: str
    name: str
    linux_user: str | None
    refused: str | None = None


@dataclass(frozen=True)
class Resolved:
    """Who a chat user is on the boxes: a Linux user (None: unknown), or why they are refused."""

    linux_user: str | None
    refused: str | None = None


def system_user_refusal(policy: Policy, name: str) -> str | None:
    """Return why a mapping to the Linux user ``name`` is refused (root, a system account)."""
    if name == "root" or name in policy.system_users:
        return (
            f"your chat account maps to the system account {name!r} "
            "(root or [reset] system_users): gpubot never acts as it; ask an admin to fix [users]"
        )
    return None


def resolve(
    policy: Policy, user_id: str, account: ChatAccount | None, home_team: str | None
) -> Resolved:
    """Decide who ``user_id`` is: refused accounts, root and system accounts never map.

    ``account`` None: the front end has no directory of accounts (the console), so only the
    ``[users]`` table applies.
    """
    if user_id in policy.bots:
        return Resolved(None, "bots cannot use gpubot")
    if account is not None:
        if account.id in policy.bots or account.bot:
            return Resolved(None, "bots cannot use gpubot")
        if account.deleted:
            return Resolved(None, "this chat account is deactivated")
        foreign = home_team is not None and account.team_id not in (None, home_team)
        if account.stranger or foreign:
            return Resolved(None, "accounts of another workspace cannot use gpubot")
        if account.guest:
            return Resolved(None, "guest accounts cannot use gpubot")
    name = linux_user(policy, user_id, account.email if account is not None else None)
    why = system_user_refusal(policy, name) if name is not None else None
    return Resolved(name) if why is None else Resolved(None, why)


def same_person(requester_user: str | None, approver_user: str | None) -> bool:
    """Whether two chat accounts are one person on the boxes (the same known Linux user)."""
    return requester_user is not None and requester_user == approver_user


def floor_note(plan: ResetPlan, linux_user: str | None, min_uid: int) -> str | None:
    """Say why the requester's own processes still need approval (a uid below ``min_uid``)."""
    if linux_user is None:
        return None
    own = [t for t in plan.targets if t.user == linux_user and t.forced]
    if not own:
        return None
    uid = own[0].uid
    root = " (root)" if uid == 0 else ""
    return (
        f"Self-service refused: {linux_user} has uid {uid}{root} on {plan.node}, below [users] "
        f"min_uid ({min_uid}); killing its processes needs an on-call approval"
    )


def is_approver(policy: Policy, user_id: str, members: Mapping[str, Collection[str]]) -> bool:
    """Whether ``user_id`` is an approver (listed, or in an approver user group)."""
    listed = user_id in policy.approvers
    return listed or any(user_id in members.get(g, ()) for g in policy.approver_groups)


def may_reset(
    policy: Policy, user_id: str, node: NodeConfig, members: Mapping[str, Collection[str]]
) -> bool:
    """Whether ``user_id`` may ask for resets on ``node`` (by node name, group or ``*``)."""
    if policy.permissions is None:
        return True
    for key in ("*", node.name, *node.groups):
        for who in policy.permissions.get(key, ()):
            if who in ("*", user_id) or user_id in members.get(who, ()):
                return True
    return False
