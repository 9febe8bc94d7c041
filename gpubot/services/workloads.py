"""What a reset does about the workload that restarts a killed process (``[reset] stop_workloads``).

By default gpubot only names the command that stops a respawning workload (``core.outcome``).
With ``stop_workloads = true`` it runs that command itself, audited like a signal, but only for
a workload the plan already kills whole: every process of it that the snapshot before the reset
saw on any GPU was a target, so stopping it kills nothing the plan did not name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpubot.core.models import NodeSnapshot, ResetStep, StopResult
from gpubot.core.plan import ResetPlan
from gpubot.core.probe_fields import printable
from gpubot.core.workload import Workload, stop_argv

if TYPE_CHECKING:
    from gpubot.services.reset_run import ResetRun


def as_planned(plan: ResetPlan, w: Workload | None) -> Workload | None:
    """Return the plan's copy of workload ``w`` (named when the plan was made), else ``w``."""
    if w is None:
        return None
    same = (t.workload for t in plan.targets if t.workload is not None)
    return next((x for x in same if (x.kind, x.id) == (w.kind, w.id)), w)


def whole_in_plan(plan: ResetPlan, before: NodeSnapshot, w: Workload) -> bool:
    """Whether every process of ``w`` seen before the reset, on any GPU, was a target."""
    targets = {(t.pid, t.start_ticks) for t in plan.targets}
    key = (w.kind, w.id)
    mine = [p for p in before.processes
            if p.workload is not None and (p.workload.kind, p.workload.id) == key]  # fmt: skip
    return bool(mine) and all((p.pid, p.start_ticks) in targets for p in mine)


async def stop_respawned(run: ResetRun, plan: ResetPlan, before: NodeSnapshot) -> bool:
    """Stop each workload that took a GPU again; return whether any stop command ran."""
    ran = False
    seen: set[tuple[str, str]] = set()
    for gpu, w in sorted(run.respawned.items()):
        if (w.kind, w.id) in seen:
            continue
        seen.add((w.kind, w.id))
        argv = stop_argv(w)
        if argv is None:
            continue
        step = ResetStep.STOP_WORKLOAD
        if not whole_in_plan(plan, before, w):
            why = "it has processes the plan does not kill"
            await run.emit(step, gpu=gpu, workload=w.to_dict(), command=" ".join(argv),
                           result=StopResult.NOT_RUN, why=why)  # fmt: skip
            continue
        # Audited before it runs (a failure to record stops the reset), like every signal.
        await run.emit(step, gpu=gpu, workload=w.to_dict(), command=" ".join(argv),
                       result=StopResult.RUNNING)  # fmt: skip
        if run.node.sudo:
            argv = ["sudo", "-n", *argv]
        res = await run.svc.transport.run(
            run.node, argv, timeout=run.svc.settings.ssh.command_timeout_s
        )
        said = printable((res.stdout + res.stderr).strip())[-300:]
        await run.emit(step, gpu=gpu, workload=w.to_dict(), command=" ".join(argv),
                       result=StopResult.DONE if res.exit_status == 0 else StopResult.FAILED,
                       exit_status=res.exit_status, output=said)  # fmt: skip
        ran = ran or res.exit_status == 0
    return ran
