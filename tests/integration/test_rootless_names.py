"""A rootless container's owner is named from its user slice, by the real probe script.

Inside a rootless container a non-root user is a subordinate uid (231072 here) that no passwd
entry names. The probe names the uid of the container's ``user-U.slice`` too (only root makes
that path), so its owner is the slice user's name even when that user holds no GPU process of
their own, while the process's identity (its uid, for every signal) stays the subordinate one.
The process runs in a real cgroup of that shape; the script is the one a node runs.
"""

from __future__ import annotations

import pwd
import subprocess
from collections.abc import Iterator

import pytest

from gpubot.core.models import ProcInfo
from gpubot.core.probe.script import PROC_SCRIPT
from gpubot.core.probe.snapshot import parse_procs, proc_argv
from gpubot.core.workload import decide_owner
from gpusim import cgroups
from gpusim.cgroups import CgroupSet

SUBORDINATE = 231072  # podman's first subordinate uid on a stock Debian (/etc/subuid)
SLICE_CALL = """[[ $R == *'/user.slice/user-'* ]] && slice_uid "$R\""""


@pytest.fixture
def rootless_process(
    cgroups_ok: None, sim_users: tuple[str, ...]
) -> Iterator[tuple[int, str, int]]:
    """A process of the subordinate uid in alice's rootless-container cgroup: (pid, alice, uid)."""
    alice = sim_users[0]
    uid = pwd.getpwnam(alice).pw_uid
    with open("/proc/self/mountinfo", encoding="utf-8") as f, open("/proc/self/cgroup") as g:
        found = cgroups.find_hierarchies(f.read(), g.read())
    assert not isinstance(found, str), found
    cgs = CgroupSet(found)
    placement = cgs.create("rootless", uid)
    proc = subprocess.Popen(["sleep", "120"], user=SUBORDINATE, group=SUBORDINATE)
    try:
        cgs.move(placement, proc.pid)
        yield proc.pid, alice, uid
    finally:
        proc.kill()  # the process this test started, by its own handle
        proc.wait()
        assert cgs.release(placement) == []


def _probe(pid: int, script: str = PROC_SCRIPT) -> ProcInfo:
    argv = proc_argv([pid])
    argv[2] = script
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    return parse_procs(out, [pid])[pid]


def test_the_slice_user_is_named_and_the_identity_kept(
    rootless_process: tuple[int, str, int],
) -> None:
    pid, alice, uid = rootless_process
    info = _probe(pid)
    assert info.uid == SUBORDINATE and info.user == str(SUBORDINATE)  # as signals see it
    assert info.workload is not None and info.workload.get("uid") == str(uid)
    assert decide_owner(info.workload, {}, None).owner == alice


def test_control_without_the_slice_lookup_the_owner_is_a_bare_uid(
    rootless_process: tuple[int, str, int],
) -> None:
    """The same process, probed by the script without its slice lookup: only the process's own
    (subordinate) uid is looked up, so the owner can be said only as ``uid U``."""
    pid, _alice, uid = rootless_process
    assert PROC_SCRIPT.count(SLICE_CALL) == 1
    info = _probe(pid, PROC_SCRIPT.replace(SLICE_CALL, ":"))
    assert info.workload is not None
    assert decide_owner(info.workload, {}, None).owner == f"uid {uid}"
