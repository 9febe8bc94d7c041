"""Whether a reset may run a workload's stop command, and how to say why not (pure).

Stopping a workload kills everything in it, so a self-service stop runs only if every process
of it is the requester's, checked on the node in the same exec (``stop_script``). This module
decides which cgroups and whose uid to ask about; anything it cannot tell keeps a self-service
stop from running. A forced reset runs the stop ungated; the node still reports whose processes
were in it, for the audit log.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpubot.core.reset.plan import ResetPlan
from gpubot.core.reset.stop_script import MAX_CGROUPS, StopCheck, check_path
from gpubot.core.runtimes import runtime_of
from gpubot.core.workload import Workload, cgroup_paths, may_restart, stop_command

NEEDS_APPROVAL = "stopping it needs an on-call approval"


def cgroup_lines(text: str | None) -> list[tuple[str, str]]:
    """Return ``(controllers, path)`` of each line of a ``/proc/PID/cgroup`` text; none for a
    text that is not what the kernel writes."""
    if not text or cgroup_paths(text) is None:
        return []
    out: list[tuple[str, str]] = []
    for line in text.split("\n"):
        if line:
            _, ctl, path = line.split(":", 2)
            out.append((ctl, path))
    return out


def _is_root_of(w: Workload, comp: str, prev: str) -> bool:
    """Whether ``comp`` (after ``prev``) is ``w``'s own cgroup directory, by its runtime's rule."""
    return runtime_of(w.kind).is_root(w, comp, prev)


def workload_root(path: str, w: Workload) -> str | None:
    """Return the prefix of ``path`` that is ``w``'s own cgroup (what its stop kills), or None;
    the first from the root wins, since root makes that directory where the shape says."""
    parts = path.split("/")
    for i in range(1, len(parts)):
        if _is_root_of(w, parts[i], parts[i - 1]):
            return "/".join(parts[: i + 1])
    return None


def stop_cgroups(texts: Iterable[str | None], w: Workload) -> tuple[tuple[str, str], ...]:
    """Return every ``(controllers, cgroup)`` of ``w`` its processes' cgroup texts name, sorted."""
    found = {
        (ctl, root)
        for text in texts
        for ctl, path in cgroup_lines(text)
        if (root := workload_root(path, w)) is not None and check_path(root)
    }
    return tuple(sorted(found))


def requester_uid(plan: ResetPlan, w: Workload) -> int | None:
    """Return the requester's uid on the node, or None unless one is clear: a target's
    effective uid, or the uid of a Slurm job's or rootless container's root-made cgroup path."""
    req = plan.requester
    if req is None:
        return None
    uids = {t.uid for t in plan.targets if t.user == req and t.uid is not None}
    wuid = w.get("uid")
    if w.owner == req and wuid is not None and wuid.isdigit():
        uids.add(int(wuid))
    return uids.pop() if len(uids) == 1 else None


def noun(w: Workload, argv: Sequence[str]) -> str:
    """Say what the stop command stops, by its last argument (``stop_command`` makes it safe)."""
    last = argv[-1] if argv else w.id
    return runtime_of(w.kind).noun.format(last)


@dataclass(frozen=True)
class StopGate:
    """What to ask the node before a stop, or why not to ask it at all."""

    argv: tuple[str, ...]
    cgroups: tuple[tuple[str, str], ...]
    gate: bool  # refuse unless every process is ``uid``'s (a self-service reset)
    uid: int | None
    why_not: str | None = None  # set: the stop is not run, nothing is asked


def gate_for(
    plan: ResetPlan, w: Workload, argv: Sequence[str], texts: Iterable[str | None], node: str
) -> StopGate:
    """Decide how ``w``'s stop command may run after ``plan``."""
    cgroups = stop_cgroups(texts, w)
    what = noun(w, argv)
    if plan.forced:
        return StopGate(tuple(argv), cgroups[:MAX_CGROUPS], False, requester_uid(plan, w))
    uid = requester_uid(plan, w)
    why: str | None = None
    if uid is None:
        who = f"user {plan.requester}" if plan.requester else "the requester"
        why = (
            f"gpubot does not know the uid of {who} on {node}, so it cannot check that every "
            f"process of {what} is theirs: {NEEDS_APPROVAL}"
        )
    elif not cgroups:
        why = f"the probe saw no cgroup of {what}, so gpubot cannot check what runs in it: "
        why += NEEDS_APPROVAL
    elif len(cgroups) > MAX_CGROUPS:
        why = f"{what} spans {len(cgroups)} cgroups, more than gpubot checks: {NEEDS_APPROVAL}"
    return StopGate(tuple(argv), cgroups, True, uid, why)


def _who(check: StopCheck) -> str:
    uids = sorted({u for f in check.foreign for u in (f.real_uid, f.uid)})
    said = [f"uid {u}" + (f" ({name})" if (name := check.name(u)) else "") for u in uids]
    pids = ", ".join(str(f.pid) for f in check.foreign[:5])
    more = check.foreign_count - min(len(check.foreign), 5)
    tail = f" and {more} more" if more > 0 else ""
    return f"{', '.join(said) or 'other users'}, pid {pids}{tail}"


def refusal(check: StopCheck | None, what: str) -> str:
    """Say why the node's check did not run the stop of ``what``."""
    if check is None or not check.refused:
        return f"the node's check before stopping {what} gave no verdict: not stopped"
    if check.foreign:
        return f"{what} also runs processes of {_who(check)}: {NEEDS_APPROVAL}"
    if check.unreadable:
        return f"gpubot could not read the cgroup of {what} on the node: {NEEDS_APPROVAL}"
    if check.unknown:
        pids = ", ".join(map(str, check.unknown[:5]))
        return f"{what} has processes whose owner gpubot could not read (pid {pids}): " + (
            NEEDS_APPROVAL
        )
    return f"gpubot found no process in the cgroup of {what}: not stopped"


def stop_note(w: Workload | None) -> str | None:
    """Say what the stop command of ``w`` ends beyond this node (``scancel``), if anything."""
    cmd = stop_command(w) if w is not None else None
    note = runtime_of(w.kind).stop_note if w is not None else None
    return f"`{cmd}` {note}" if cmd is not None and note is not None else None


def plan_stop_notes(plan: ResetPlan) -> tuple[str, ...]:
    """Say, for an approver, what stopping each restarting workload of the plan would end."""
    notes: dict[str, None] = {}
    for t in plan.targets:
        w = t.workload
        cmd = stop_command(w) if w is not None and may_restart(w) else None
        if w is None or cmd is None:
            continue
        what = noun(w, cmd.split(" "))
        extra = stop_note(w)
        notes[
            f"If it restarts, the fix is `{cmd}`: it stops every process of {what}, "
            "whoever runs them" + (f"; {extra}" if extra else "")
        ] = None
    return tuple(notes)
