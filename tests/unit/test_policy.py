"""Person, approvers and node permissions, from validated settings tables (the validation
itself: ``test_config_tables``)."""

from __future__ import annotations

from typing import Any

import pytest

from gpubot.config import parse
from gpubot.core.models import NodeConfig
from gpubot.core.policy import Policy, is_approver, linux_user, may_reset

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


def policy_of(tables: dict[str, Any]) -> Policy:
    """Return the policy the settings tables make."""
    return parse(tables).policy


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
    assert linux_user(policy_of(EXTRA), user, email) == want


def test_identity_without_email_mapping() -> None:
    p = policy_of({"users": {"U0ALICE": "alice"}})
    assert linux_user(p, "U0DAVE", "dave@example.com") is None


def test_approvers() -> None:
    p = policy_of(EXTRA)
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
    assert may_reset(policy_of(EXTRA), user, node, members) is want


def test_no_permissions_table_means_everyone() -> None:
    assert may_reset(policy_of({}), "U0ANY", N2, {})
    assert not may_reset(policy_of({"permissions": {}}), "U0ANY", N2, {})
