"""``gpubot doctor`` on a Slurm node: does the scheduler answer, and may gpubot's account drain?

``scontrol update NodeName=N State=DRAIN|RESUME`` is refused by slurmctld unless the caller is
root, SlurmUser, or has ``AdminLevel=Operator`` (or ``Administrator``) in accounting
(``sacctmgr show user NAME format=adminlevel``). On a ``sudo = true`` node gpubot runs it with
``sudo -n``, as root: then what counts is a NOPASSWD sudoers line for exactly the two commands
(``GPUBOT_DRAIN`` in the README's rule). One exec asks the account's uid and name, SlurmUser
and the admin level; the checks say which right is present, in one line.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from gpubot.core.doctor.checks import Check, failed, passed
from gpubot.core.doctor.sudo import README_RULE, parse_sudo_list
from gpubot.core.text import cut, one_line

DRAIN_RIGHTS = "Slurm drain rights"
MARK = "@gpubot-slurm-doctor"
# What the README's GPUBOT_DRAIN holds (the argv of core.slurm.drain.update_argv).
SUDO_DRAIN = tuple(args for alias, _, args in README_RULE if alias == "GPUBOT_DRAIN")
OPERATOR_LEVELS = ("Operator", "Administrator")
SCRIPT = r"""t=$1
m() { printf '\n@gpubot-slurm-doctor %s\n' "$*"; }
m uid "$(id -u 2>/dev/null || echo -)"
m user "$(id -un 2>/dev/null || echo -)"
m slurmuser "$(timeout -k 1 "$t" scontrol show config 2>/dev/null | sed -n 's/^SlurmUser *= *//p')"
m admin
timeout -k 1 "$t" sacctmgr -n -P show user "$(id -un)" format=user,adminlevel 2>&1
m admin-exit "$?"
m end
"""


def rights_argv(timeout_s: float) -> list[str]:
    return ["sh", "-c", SCRIPT, "gpubot-slurm-doctor", f"{max(1.0, timeout_s):.0f}"]


@dataclass(frozen=True)
class RightsFacts:
    """The node's answer: None where it did not say."""

    complete: bool = False
    uid: int | None = None
    user: str | None = None
    slurm_user: str | None = None  # SlurmUser's name ("root" of "root(0)")
    admin_level: str | None = None  # sacctmgr's level of ``user``; None: not said
    admin_error: str | None = None  # why sacctmgr could not tell


def parse_rights(stdout: str) -> RightsFacts:
    args: dict[str, str] = {}
    body: dict[str, list[str]] = {}
    kind = ""
    for line in stdout.splitlines():
        if line.startswith(MARK + " "):
            kind, _, rest = line[len(MARK) + 1 :].partition(" ")
            args[kind] = rest.strip()
            body[kind] = []
        elif kind and line.strip():
            body[kind].append(line.strip())
    uid = args.get("uid", "")
    user = args.get("user") or None
    rows = [r.split("|") for r in body.get("admin", [])]
    level = next((r[1] for r in rows if len(r) == 2 and r[0] == user), None)
    error = None
    if args.get("admin-exit") != "0":
        error = cut(one_line(" ".join(body.get("admin", [])) or "no output"), 160)
    elif level is None:
        error = f"{user} is not a user in Slurm's accounting"
    return RightsFacts(
        complete="end" in args,
        uid=int(uid) if uid.isdigit() else None,
        user=None if user == "-" else user,
        slurm_user=(args.get("slurmuser") or "").partition("(")[0] or None,
        admin_level=level,
        admin_error=error,
    )


def drain_rights_check(area: str, sudo: bool, facts: RightsFacts, sudo_list: str | None) -> Check:
    """Which right lets gpubot's account drain and resume this node, in one line (or the line
    that gives it one). ``sudo_list``: ``sudo -n -l``'s answer on a ``sudo = true`` node."""
    if sudo:
        return _sudo_rights(area, sudo_list)
    if not facts.complete:
        return failed(area, DRAIN_RIGHTS, "the node's answer was cut short", "check scontrol there")
    who = facts.user or "gpubot's account"
    if facts.uid == 0:
        return passed(area, DRAIN_RIGHTS, "root: Slurm lets it scontrol update")
    if facts.user is not None and facts.user == facts.slurm_user:
        return passed(area, DRAIN_RIGHTS, f"{who} is SlurmUser")
    if facts.admin_level in OPERATOR_LEVELS:
        return passed(area, DRAIN_RIGHTS, f"{who} has AdminLevel={facts.admin_level} (sacctmgr)")
    said = facts.admin_error or f"{who} has AdminLevel={facts.admin_level}"
    return failed(
        area,
        DRAIN_RIGHTS,
        f"scontrol update would be refused: {said}",
        f"sacctmgr -i modify user {who} set adminlevel=operator, or set sudo = true for {area} "
        "with the README's GPUBOT_DRAIN line",
    )


def _sudo_rights(area: str, sudo_list: str | None) -> Check:
    have = {
        g.command.partition(" ")[2]
        for g in parse_sudo_list(sudo_list or "")
        if g.nopasswd
        and g.runas in ("root", "root : root")
        and posixpath.basename(g.command.partition(" ")[0]) == "scontrol"
        and g.command.startswith("/")
    }
    missing = [c for c in SUDO_DRAIN if c not in have]
    if not missing:
        return passed(area, DRAIN_RIGHTS, "sudo -n scontrol update (GPUBOT_DRAIN in the sudoers)")
    return failed(
        area,
        DRAIN_RIGHTS,
        f"sudo = true, but no NOPASSWD sudoers line for scontrol {'; scontrol '.join(missing)}",
        "add the README's GPUBOT_DRAIN line (visudo -f /etc/sudoers.d/gpubot)",
    )


def scheduler_check(area: str, error: str | None, known: bool, node: str, state: str) -> Check:
    """Whether ``sinfo``/``squeue --json`` answer on the node and Slurm knows it there."""
    name = "Slurm clients (sinfo, squeue)"
    if error is not None:
        return failed(
            area,
            name,
            error,
            f"check that Slurm's clients on {area} reach slurmctld (slurm.conf, munge)",
        )
    if not known:
        return failed(
            area,
            name,
            f"Slurm has no node {node!r}",
            f"set slurm_node for {area} to its NodeName in Slurm (sinfo -N)",
        )
    return passed(area, name, f"answer; Slurm holds {node} {state}")


def restd_check(area: str, url: str, user: str, version: str | None, error: str | None) -> Check:
    """Whether the cluster's slurmrestd answers for the node with the token."""
    name = "slurmrestd"
    if error is None:
        return passed(area, name, f"{url} answers as {user} ({version})")
    if "is not set" in error:
        fix = f"set it to a JWT for {user} (scontrol token username={user} lifespan=...)"
    elif "HTTP 401" in error or "HTTP 500" in error:
        fix = f"renew the JWT for {user} (scontrol token username={user}); reads use SSH meanwhile"
    else:
        fix = "check [slurm] restd_url and that slurmrestd runs there; statuses fall back to SSH"
    return failed(area, name, error, fix)
