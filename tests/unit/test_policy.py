"""Identity, approvers and node permissions, from validated settings tables."""

from __future__ import annotations

from typing import Any

import pytest

from gpubot.core.models import NodeConfig
from gpubot.core.policy import Policy, is_approver, linux_user, load_policy, may_reset
from gpubot.errors import ConfigError

EXTRA: dict[str, Any] = {
    "slack": {"channel": "C0GENERAL", "oncall_channel": "C0ONCALL"},
    "users": {
        "U0ALICE": "alice",
        "U0BOB": "bob",
        "email_local_part": True,
        "email_domains": ["example.com"],
    },
    "approvals": {"approvers": ["U0CAROL"], "usergroup": "S0ONCALL", "expiry_s": 60},
    "permissions": {"team-a": ["U0ALICE", "S0TEAMA"], "*": ["S0ADMINS"], "node9": ["*"]},
}

N1 = NodeConfig("node1", "h1", groups=("team-a",))
N2 = NodeConfig("node2", "h2", groups=("team-b",))
N9 = NodeConfig("node9", "h9")


def test_loads_every_table() -> None:
    p = load_policy(EXTRA, "g.toml")
    assert p.users == {"U0ALICE": "alice", "U0BOB": "bob"}
    assert p.email_local_part and p.email_domains == ("example.com",)
    assert p.approvers == frozenset({"U0CAROL"}) and p.approver_groups == ("S0ONCALL",)
    assert p.expiry_s == 60.0
    assert p.approval_channel == "C0ONCALL"
    assert p.groups_to_resolve() == ("S0ADMINS", "S0ONCALL", "S0TEAMA")


def test_defaults() -> None:
    p = load_policy({})
    assert p == Policy()
    assert p.expiry_s == 900.0 and p.permissions is None and p.approval_channel is None
    assert load_policy({"slack": {"channel": "C1X"}}).approval_channel == "C1X"
    groups = load_policy({"approvals": {"usergroup": ["S1A", "S2X"]}}).approver_groups
    assert groups == ("S1A", "S2X")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"slack": []}, "slack: expected a table"),
        ({"slack": {"chanel": "C1"}}, "slack.chanel: unknown key"),
        ({"slack": {"channel": "#general"}}, "slack.channel: expected a channel id"),
        ({"users": {"U0A": "Alice Smith"}}, "users.U0A: expected a Linux user name"),
        ({"users": {"alice": "alice"}}, "users.alice: not a Slack user id"),
        ({"users": {"email_local_part": "yes"}}, "users.email_local_part: expected true"),
        ({"approvals": {"approvers": "U0A"}}, "approvals.approvers: expected a list"),
        ({"approvals": {"approvers": ["alice"]}}, "'alice' is not a Slack user id"),
        ({"approvals": {"usergroup": "U0A"}}, "is not a user group id"),
        ({"approvals": {"expiry_s": 0}}, "approvals.expiry_s: expected seconds > 0"),
        ({"approvals": {"expiry_s": True}}, "approvals.expiry_s"),
        ({"approvals": {"quorum": 2}}, "approvals.quorum: unknown key"),
        ({"permissions": {"team a": ["*"]}}, "permissions.team a: not a node or group"),
        ({"permissions": {"team-a": ["alice"]}}, "'alice' is not a user id"),
        ({"permissions": {"team-a": "U0A"}}, "permissions.team-a: expected a list"),
    ],
)
def test_refuses_bad_tables(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_policy(extra, "g.toml")
    assert str(exc.value).startswith("g.toml: ")
    assert message in str(exc.value)


@pytest.mark.parametrize(
    ("user", "email", "want"),
    [
        ("U0ALICE", None, "alice"),
        ("U0ALICE", "someone@example.com", "alice"),  # the table wins
        ("U0DAVE", "dave@example.com", "dave"),
        ("U0DAVE", "Dave@EXAMPLE.com", "dave"),
        ("U0DAVE", "dave@elsewhere.org", None),  # not a trusted domain
        ("U0DAVE", "d.ave+x@example.com", None),  # not a Linux user name
        ("U0DAVE", "a@b@example.com", None),
        ("U0DAVE", None, None),
    ],
)
def test_identity(user: str, email: str | None, want: str | None) -> None:
    assert linux_user(load_policy(EXTRA), user, email) == want


def test_identity_without_email_mapping() -> None:
    p = load_policy({"users": {"U0ALICE": "alice"}})
    assert linux_user(p, "U0DAVE", "dave@example.com") is None


def test_approvers() -> None:
    p = load_policy(EXTRA)
    members = {"S0ONCALL": {"U0ERIN"}}
    assert is_approver(p, "U0CAROL", {})
    assert is_approver(p, "U0ERIN", members)
    assert not is_approver(p, "U0ERIN", {})
    assert not is_approver(p, "U0ALICE", members)


@pytest.mark.parametrize(
    ("user", "node", "members", "want"),
    [
        ("U0ALICE", N1, {}, True),  # listed on the node's group
        ("U0ALICE", N2, {}, False),  # no rule for team-b lists her
        ("U0FRANK", N1, {"S0TEAMA": {"U0FRANK"}}, True),  # via the group's user group
        ("U0FRANK", N1, {}, False),
        ("U0GRACE", N2, {"S0ADMINS": {"U0GRACE"}}, True),  # "*" key: every node
        ("U0ANY", N9, {}, True),  # node name key, "*" value: everyone
    ],
)
def test_node_permissions(
    user: str, node: NodeConfig, members: dict[str, set[str]], want: bool
) -> None:
    assert may_reset(load_policy(EXTRA), user, node, members) is want


def test_no_permissions_table_means_everyone() -> None:
    assert may_reset(load_policy({}), "U0ANY", N2, {})
    assert not may_reset(load_policy({"permissions": {}}), "U0ANY", N2, {})
