"""``gpubot doctor``'s drain rights on a Slurm node (``core.doctor.slurm``): the facts the node
gives, and which right is named. The real node's lines are in
tests/integration/test_doctor_slurm.py; the sudo case is here, over sudo's listing."""

from __future__ import annotations

import pytest

from gpubot.core.doctor.slurm import MARK, RightsFacts, drain_rights_check, parse_rights

# As sudo 1.9.13 (Debian 12) printed the README's GPUBOT_DRAIN for `sudo -l -U nobody` here (on
# one line, not a terminal; wrapped as on one): it writes sudoers' escapes of "=" back, whether
# the rule escaped them or not.
LISTING = r"""User gpubot may run the following commands on gpu3:
    (root) NOPASSWD: /usr/bin/kill -s TERM [0-9]*, /usr/bin/scontrol update
        NodeName\=* State\=DRAIN Reason\=*, /usr/bin/scontrol update NodeName\=*
        State\=RESUME
"""


def answer(uid: str, user: str, admin: str, rc: str = "0") -> str:
    return (
        f"\n{MARK} uid {uid}\n\n{MARK} user {user}\n\n{MARK} slurmuser slurm(64030)\n"
        f"\n{MARK} admin\n{admin}\n\n{MARK} admin-exit {rc}\n\n{MARK} end\n"
    )


@pytest.mark.parametrize(
    ("stdout", "ok", "detail"),
    [
        (answer("0", "root", "root|Administrator"), True, "root: Slurm lets it scontrol update"),
        (answer("64030", "slurm", ""), True, "slurm is SlurmUser"),
        (answer("1001", "gpubot", "gpubot|Operator"), True, "gpubot has AdminLevel=Operator"),
        (answer("1001", "gpubot", "gpubot|None"), False, "gpubot has AdminLevel=None"),
        (answer("1001", "gpubot", ""), False, "gpubot is not a user in Slurm's accounting"),
        (
            answer("1001", "gpubot", "sacctmgr: error: Problem talking to the database", "1"),
            False,
            "Problem talking to the database",
        ),
        (answer("1001", "gpubot", "other|Operator"), False, "not a user in Slurm's accounting"),
    ],
)
def test_which_right_is_named(stdout: str, ok: bool, detail: str) -> None:
    check = drain_rights_check("node1", False, parse_rights(stdout), None)
    assert check.ok is ok and detail in check.detail
    assert ok or "adminlevel=operator" in check.fix


def test_on_a_sudo_node_the_sudoers_lines_count_not_the_account() -> None:
    facts = parse_rights(answer("1001", "gpubot", "gpubot|Operator"))
    assert drain_rights_check("node1", True, facts, LISTING).ok
    without = LISTING.replace(r"State\=RESUME", r"State\=DOWN")
    check = drain_rights_check("node1", True, facts, without)  # control: a line missing
    assert not check.ok and r"State\=RESUME" in check.detail and "GPUBOT_DRAIN" in check.fix
    assert not drain_rights_check("node1", True, RightsFacts(complete=True, uid=0), None).ok
