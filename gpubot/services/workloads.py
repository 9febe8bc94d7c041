"""What a reset does about the workload that restarts a killed process (``[reset] stop_workloads``).

By default gpubot only names the stop command. With ``stop_workloads = true`` it runs it, audited
like a signal, only for a workload the plan already kills whole on the GPUs and, self-service,
only if every process of it is the requester's (checked on the node in the same exec). Otherwise
the refusal is audited and the GPU's outcome says stopping needs an on-call approval.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpubot.core.models import NodeSnapshot, Outcome, ResetStep, StopResult
from gpubot.core.nodelog import is_marker, parse_marker, quoted
from gpubot.core.probe.fields import printable
from gpubot.core.reset.outcome import GpuResult
from gpubot.core.reset.plan import ResetPlan
from gpubot.core.reset.stop_script import StopCheck, parse_stop_output, stop_check_argv
from gpubot.core.reset.stopgate import gate_for, noun, refusal, stop_note
from gpubot.core.workload import Workload, stop_argv
from gpubot.errors import GpubotError
from gpubot.services.run_state import RunState

Results = tuple[GpuResult, ...]


def as_planned(plan: ResetPlan, w: Workload | None) -> Workload | None:
    """Return the plan's copy of workload ``w`` (named when the plan was made), else ``w``."""
    if w is None:
        return None
    same = (t.workload for t in plan.targets if t.workload is not None)
    return next((x for x in same if x.key == w.key), w)


def _of(before: NodeSnapshot, w: Workload) -> list[Any]:
    return [p for p in before.processes if p.workload is not None and p.workload.key == w.key]


def whole_in_plan(plan: ResetPlan, before: NodeSnapshot, w: Workload) -> bool:
    """Whether every process of ``w`` seen before the reset, on any GPU, was a target."""
    targets = {(t.pid, t.start_ticks) for t in plan.targets}
    mine = _of(before, w)
    return bool(mine) and all((p.pid, p.start_ticks) in targets for p in mine)


async def after_respawn(
    run: RunState,
    plan: ResetPlan,
    before: NodeSnapshot | None,
    results: Results,
    reverify: Callable[[], Awaitable[Results]],
) -> Results:
    """Stop what respawned, verify again if a stop ran, and say in each respawned GPU's outcome
    why it was not stopped."""
    notes: dict[int, str] = {}
    if run.cfg.stop_workloads and run.respawned and before is not None:
        ran, notes = await stop_respawned(run, plan, before)
        if ran:
            run.respawned = {}
            results = await reverify()
    return annotate(results, run.respawned, notes)


def annotate(
    results: Results, respawned: Mapping[int, Workload], notes: Mapping[int, str]
) -> Results:
    """Add each respawned GPU's note (a refused stop) and ``scancel``'s reach to its detail."""
    out = []
    for g in results:
        if g.outcome is Outcome.RESPAWNED:
            extra = [x for x in (notes.get(g.index), stop_note(respawned.get(g.index))) if x]
            if extra:
                g = replace(g, detail=f"{g.detail} ({'; '.join(extra)})")
        out.append(g)
    return tuple(out)


async def stop_respawned(
    run: RunState, plan: ResetPlan, before: NodeSnapshot
) -> tuple[bool, dict[int, str]]:
    """Stop each workload that took a GPU again; return whether any stop command ran, and for
    each GPU whose workload was not stopped, why."""
    ran = False
    notes: dict[int, str] = {}
    done: dict[tuple[str, str, str], str | None] = {}
    for gpu, w in sorted(run.respawned.items()):
        key = w.key
        if key not in done:
            argv = stop_argv(w)
            done[key] = None if argv is None else await _stop_one(run, plan, before, gpu, w, argv)
            ran = ran or (argv is not None and done[key] is None)
        why = done[key]
        if why is not None:
            notes[gpu] = f"gpubot did not stop it: {why}"
    return ran, notes


async def _stop_one(
    run: RunState, plan: ResetPlan, before: NodeSnapshot, gpu: int, w: Workload, argv: list[str]
) -> str | None:
    """Stop one workload; return None when its stop command ran and succeeded, else why not."""
    base: dict[str, Any] = {"gpu": gpu, "workload": w.to_dict(), "command": " ".join(argv)}
    step = ResetStep.STOP_WORKLOAD

    async def not_run(why: str, more: Mapping[str, Any] | None = None, **after: Any) -> str:
        await run.emit(step, **base, **(more or {}), result=StopResult.NOT_RUN, why=why, **after)
        return why

    if not whole_in_plan(plan, before, w):
        return await not_run("it has processes on GPUs that the plan does not kill")
    g = gate_for(plan, w, argv, (p.cgroup for p in _of(before, w)), run.node.name)
    gate = {
        "forced": plan.forced,
        "requester_uid": g.uid,
        "cgroups": [f"{c}:{p}" for c, p in g.cgroups],
    }
    if g.why_not is not None:
        return await not_run(g.why_not, gate)
    named = f"{w.kind} {quoted(w.name or w.id)} ({quoted(' '.join(argv), 120)})"
    note = run.note(f"stop {named}", (gpu,))
    try:
        checked = stop_check_argv(
            g.argv,
            g.cgroups,
            uid=g.uid,
            gate=g.gate,
            sudo=run.node.sudo,
            kind=str(w.kind),
            note=note,
        )
    except ValueError as exc:
        return await not_run(f"gpubot cannot check {noun(w, argv)} ({exc}): not stopped", gate)
    # Audited before it runs (a failure to record stops the reset), like every signal.
    await run.emit(step, **base, **gate, result=StopResult.RUNNING)
    try:
        check, status, said = await _run_checked(run, checked)
    except GpubotError as exc:
        why = f"no answer from {run.node.name} ({exc}): whether it stopped is unknown"
        await run.emit(step, **base, result=StopResult.FAILED, why=why)
        return why
    found = _found(check, g.cgroups)
    if note and check is not None and check.stopping:  # the line is written only with the stop
        await run.logged(parse_marker(check.logger or "", note))
    if check is None or not check.stopping:
        return await not_run(refusal(check, noun(w, argv)), found, exit_status=status, output=said)
    ok = status == 0
    result = StopResult.DONE if ok else StopResult.FAILED
    await run.emit(step, **base, **found, result=result, exit_status=status, output=said)
    return None if ok else f"`{' '.join(argv)}` failed on the node (exit {status})"


async def _run_checked(run: RunState, argv: list[str]) -> tuple[StopCheck | None, int, str]:
    """Run the check and the stop in one exec; return the findings (None: unparsable), the exit
    status and the printable end of what it printed."""
    res = await run.remote(argv)
    try:
        check: StopCheck | None = parse_stop_output(res.stdout)
    except GpubotError:  # not the script's lines: what ran is judged by its verdict alone
        lines = res.stdout.split("\n")
        ran = "stopping" in lines
        at = lines.index("stopping") if ran else 0
        after = "\n".join(lines[at + 1 :]) if ran else ""
        said = next((x for x in lines[:at] if is_marker(x)), None)
        check = StopCheck(stopping=True, refused=False, output=after, logger=said) if ran else None
    out = check.output if check is not None and check.stopping else res.stdout
    said = printable((out + res.stderr).strip())[-300:]
    return check, res.exit_status, said


def _found(check: StopCheck | None, cgroups: Sequence[tuple[str, str]]) -> dict[str, Any]:
    if check is None:
        return {}
    return {
        "checked": check.checked,
        "foreign": [{"pid": f.pid, "real_uid": f.real_uid, "uid": f.uid} for f in check.foreign],
        "foreign_count": check.foreign_count,
        "unknown": list(check.unknown),
        "unreadable": [f"{c}:{p}" for i, (c, p) in enumerate(cgroups, 1) if i in check.unreadable],
    }
