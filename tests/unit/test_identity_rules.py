"""Who may use gpubot, who may approve, and the self-service floor: tables for the pure rules."""

from __future__ import annotations

from typing import Any

import pytest

from gpubot.config import parse
from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.policy import (
    ChatAccount,
    Policy,
    Resolved,
    floor_note,
    linux_user,
    resolve,
    same_person,
    system_user_refusal,
)
from gpubot.core.reset.plan import ResetRequest, below_floor, plan_reset
from gpubot.core.reset.protect import Protection
from gpubot.slack.api import account_of

USERS: dict[str, Any] = {
    "users": {
        "U0ALICE": "alice",
        "U0ROOT": "root",
        "U0PERS": "nvidia-persistenced",
        "email_local_part": True,
        "email_domains": ["example.com"],
    }
}


def policy_of(tables: dict[str, Any], system_users: tuple[str, ...] | None = None) -> Policy:
    """Return the policy the settings tables make (``system_users``: ``[reset]``'s)."""
    if system_users is not None:
        tables = {**tables, "reset": {"system_users": list(system_users)}}
    return parse(tables).policy


P = policy_of(USERS)
OK = ChatAccount("U0DAVE", team_id="T0HOME", email="dave@example.com")


@pytest.mark.parametrize(
    ("flags", "want"),
    [
        ({}, ChatAccount("U0A")),
        ({"is_restricted": True}, ChatAccount("U0A", guest=True)),  # a multi-channel guest
        ({"is_ultra_restricted": True}, ChatAccount("U0A", guest=True)),  # single-channel
        ({"is_app_user": True}, ChatAccount("U0A", bot=True)),
        ({"is_stranger": True, "team_id": "T0B"}, ChatAccount("U0A", "T0B", stranger=True)),
        ({"is_restricted": "yes"}, ChatAccount("U0A")),  # only a true flag counts
    ],
)
def test_slack_says_of_an_account_what_the_rules_read(
    flags: dict[str, Any], want: ChatAccount
) -> None:
    assert account_of("U0A", {"id": "U0A", **flags}) == want


def test_no_email_mapping_without_domains() -> None:
    # A Policy built by hand (not from a file) with no domains maps no e-mail at all.
    p = Policy(email_local_part=True)
    assert linux_user(p, "U0X", "bob@anything.org") is None


@pytest.mark.parametrize(
    ("account", "home", "want"),
    [
        (OK, "T0HOME", None),
        (OK, None, None),  # home team unknown: only the account's own flags count
        (ChatAccount("U0G", guest=True), "T0HOME", "guest accounts cannot use gpubot"),
        (ChatAccount("U0G", guest=True), None, "guest accounts cannot use gpubot"),
        (ChatAccount("U0S", stranger=True), None, "accounts of another workspace"),
        (ChatAccount("U0S", team_id="T0OTHER"), "T0HOME", "accounts of another workspace"),
        (ChatAccount("U0S", team_id="T0OTHER"), None, None),
        (ChatAccount("U0D", deleted=True), "T0HOME", "this chat account is deactivated"),
        (ChatAccount("U0B", bot=True), "T0HOME", "bots cannot use gpubot"),
        (ChatAccount("USLACKBOT"), "T0HOME", "bots cannot use gpubot"),
        # the worst flag wins the message; every one refuses
        (ChatAccount("U0X", deleted=True, guest=True), None, "deactivated"),
    ],
)
def test_account_refusals(account: ChatAccount, home: str | None, want: str | None) -> None:
    got = resolve(P, account.id, account, home).refused  # P.bots: the ones settings name
    assert got == want if want is None else (got is not None and want in got)


@pytest.mark.parametrize(
    ("user", "account", "linux", "refused"),
    [
        ("U0ALICE", None, "alice", None),  # the console: the table only
        ("U0ALICE", ChatAccount("U0ALICE", team_id="T0HOME"), "alice", None),
        ("U0DAVE", OK, "dave", None),  # by e-mail, a trusted domain
        ("U0ROOT", None, None, "system account 'root'"),
        ("U0PERS", None, None, "system account 'nvidia-persistenced'"),
        ("U0ROOT2", ChatAccount("U0ROOT2", email="root@example.com"), None, "'root'"),
        ("U0ROOT3", ChatAccount("U0ROOT3", email="Root@Example.com"), None, "'root'"),
        ("U0ALICE", ChatAccount("U0ALICE", guest=True), None, "guest"),  # never mapped
        ("U0DAVE", ChatAccount("U0DAVE", email="dave@elsewhere.org"), None, None),  # unknown
        ("USLACKBOT", None, None, "bots"),
    ],
)
def test_resolve(
    user: str, account: ChatAccount | None, linux: str | None, refused: str | None
) -> None:
    got = resolve(P, user, account, "T0HOME")
    assert got.linux_user == linux
    if refused is None:
        assert got == Resolved(linux)
    else:
        assert got.refused is not None and refused in got.refused


def test_system_users_come_from_the_reset_settings() -> None:
    p = policy_of({"users": {"U0G": "gdm"}}, system_users=("root", "gdm"))
    assert resolve(p, "U0G", None, None).refused is not None
    assert system_user_refusal(p, "root") is not None  # root always, listed or not
    assert system_user_refusal(policy_of({}, system_users=()), "root") is not None
    assert system_user_refusal(p, "alice") is None


@pytest.mark.parametrize(
    ("requester", "approver", "want"),
    [
        ("carol", "carol", True),
        ("carol", "dave", False),
        (None, None, False),
        (None, "carol", False),
        ("carol", None, False),
    ],
)
def test_same_person(requester: str | None, approver: str | None, want: bool) -> None:
    assert same_person(requester, approver) is want


@pytest.mark.parametrize(
    ("uid", "floor", "want"),
    [
        (0, None, False),
        (0, 0, True),
        (0, 1000, True),
        (999, 1000, True),
        (1000, 1000, False),
        (65534, 1000, False),
        (None, 1000, True),
        (500, 0, False),
    ],
)
def test_below_floor(uid: int | None, floor: int | None, want: bool) -> None:
    assert below_floor(uid, floor) is want


def _snapshot(*procs: tuple[int, str, int]) -> NodeSnapshot:
    gpus = (GpuInfo(0, "GPU-0", "H200", 9000, 143771, 10, minor=0),)
    return NodeSnapshot(
        "node1",
        0.0,
        gpus,
        tuple(
            GpuProcess(
                pid,
                0,
                1000,
                "python3",
                True,
                True,
                user=user,
                uid=uid,
                real_uid=uid,
                start_ticks=pid * 10,
                state="S",
                command="python3 train.py",
            )
            for pid, user, uid in procs
        ),
    )


@pytest.mark.parametrize(
    ("requester", "floor", "procs", "forced"),
    [
        ("alice", 1000, [(11, "alice", 1001)], [False]),  # her own: self-service
        ("alice", 1000, [(11, "bob", 1002)], [True]),  # someone else's
        ("svc", 1000, [(11, "svc", 998)], [True]),  # hers by name, but a system uid
        ("root", 1000, [(11, "root", 0)], [True]),  # root is never self-service
        ("root", 0, [(11, "root", 0)], [True]),  # not even with the floor at 0
        ("root", None, [(11, "root", 0)], [False]),  # no floor: the CLI on the gpubot host
        (None, 1000, [(11, "alice", 1001)], [True]),  # unknown requester
        ("alice", 1000, [(11, "alice", 1001), (12, "alice", 999)], [False, True]),
    ],
)
def test_the_floor_makes_a_kill_forced(
    requester: str | None,
    floor: int | None,
    procs: list[tuple[int, str, int]],
    forced: list[bool],
) -> None:
    plan = plan_reset(
        _snapshot(*procs), ResetRequest("node1", requester, min_uid=floor), Protection()
    )
    assert [t.forced for t in plan.targets] == forced


def test_floor_note_says_why_own_processes_need_approval() -> None:
    plan = plan_reset(
        _snapshot((11, "svc", 998)), ResetRequest("node1", "svc", min_uid=1000), Protection()
    )
    note = floor_note(plan, "svc", 1000)
    assert note is not None and "svc has uid 998 on node1, below [users] min_uid (1000)" in note
    assert "below min_uid 1000" in plan.targets[0].reasons[-1]
    root = plan_reset(
        _snapshot((11, "root", 0)), ResetRequest("node1", "root", min_uid=1000), Protection()
    )
    assert "root has uid 0 (root) on node1" in (floor_note(root, "root", 1000) or "")
    other = plan_reset(
        _snapshot((11, "bob", 1002)), ResetRequest("node1", "alice", min_uid=1000), Protection()
    )
    assert floor_note(other, "alice", 1000) is None  # forced, but not for the floor
    assert floor_note(other, None, 1000) is None
