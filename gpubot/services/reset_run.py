"""One reset in progress: SIGTERM → grace → SIGKILL → verify, or ``nvidia-smi --gpu-reset``.

Only planned processes are signalled, each after an identity check on the node. The run's
state, its ports and its audited steps are ``run_state``'s; verification is ``verify``'s, and
what is done about a workload that respawns is ``workloads``'.
"""

from __future__ import annotations

import shlex

from gpubot.core.models import NodeSnapshot, ResetStep
from gpubot.core.names import as_root
from gpubot.core.nodelog import TargetName, logged_argv, split_logged
from gpubot.core.probe.nvsmi import USABLE_EXIT
from gpubot.core.reset.outcome import GpuObservation, GpuResult, Survivor
from gpubot.core.reset.plan import ResetPlan
from gpubot.core.reset.signals import PidReport, PidStatus
from gpubot.errors import GpubotError
from gpubot.services.run_state import Pairs, ResetEvent, RunState, ids_of
from gpubot.services.verify import conclude, verify
from gpubot.services.workloads import after_respawn

__all__ = ["ResetEvent"]  # re-exported


class ResetRun(RunState):
    """A reset in progress: the signals, the GPU reset, and the snapshot after."""

    async def reset(
        self, plan: ResetPlan, grace_s: float, before: NodeSnapshot | None = None
    ) -> tuple[GpuResult, ...]:
        """Signal the plan's targets and verify every targeted GPU; with ``[reset]
        stop_workloads``, stop what respawned them and verify again."""
        results = await self.terminate(plan, grace_s)
        return await after_respawn(
            self, plan, before, results, lambda: verify(self, plan, {}, {}, {})
        )

    async def terminate(self, plan: ResetPlan, grace_s: float) -> tuple[GpuResult, ...]:
        self.gpus = plan.gpus
        self.names = {t.pid: TargetName(t.pid, t.user, t.command) for t in plan.targets}
        await self.emit(
            ResetStep.PLANNED,
            gpus=list(plan.gpus),
            targets=[t.pid for t in plan.targets],
            forced=plan.forced,
        )
        pairs: Pairs = {}
        for t in plan.targets:
            if t.start_ticks is None or t.uid is None:  # a plan from before owners were known
                self.refused[t.pid] = "the plan does not know its start time and owner"
                await self.emit(
                    ResetStep.SIGNAL,
                    pid=t.pid,
                    signal="SIGTERM",
                    result=PidStatus.NOT_SENT,
                    why=self.refused[t.pid],
                )
            else:
                pairs[t.pid] = (t.start_ticks, t.uid)
        clock = self.clock
        deaths: dict[int, float] = {}
        alive = await self.send("TERM", pairs, deaths)
        alive = await self.wait_gone(alive, pairs, deaths, clock.monotonic() + grace_s)
        last: dict[int, PidReport] = {}
        if alive:
            alive = await self.send("KILL", {p: pairs[p] for p in alive}, deaths)
            kill_wait = min(5.0, self.cfg.verify_timeout_s)
            alive = await self.wait_gone(alive, pairs, deaths, clock.monotonic() + kill_wait)
            last = await self.signal("check", ids_of(pairs, alive))
        survivors = {
            p: Survivor(p, r.state, r.wchan) for p, r in last.items() if r.status == PidStatus.ALIVE
        }
        return await verify(self, plan, pairs, deaths, survivors)

    async def smi(self, *args: str, gpu: int, what: str) -> tuple[int, str]:
        """Run a privileged ``nvidia-smi ARGS`` (``sudo -n`` where configured) on GPU ``gpu``,
        its node log line (``what`` it does) written in the same exec; return its say."""
        shown = shlex.join(["nvidia-smi", *args])
        await self.before_sending(command=shown)
        argv = as_root([self.node.nvidia_smi, *args], sudo=self.node.sudo)
        note = self.note(f"{what} ({shown})", (gpu,))
        res = await self.remote(logged_argv(note, argv) if note else argv)
        log, stdout = split_logged(res.stdout, note) if note else (None, res.stdout)
        if log is not None:
            await self.logged(log)
        return res.exit_status, (stdout + res.stderr).strip()

    async def gpu_reset(
        self, plan: ResetPlan, gpu: int, *, toggle: bool = False
    ) -> tuple[GpuResult, ...]:
        """Run ``nvidia-smi --gpu-reset -i N`` and verify the GPU's memory is back.

        ``toggle``: persistence mode off before (the daemon lets the GPU go) and on after.
        """
        if not toggle:
            return await self._gpu_reset(plan, gpu)
        off = "persistence mode off for the GPU reset"
        status, text = await self.smi("-pm", "0", "-i", str(gpu), gpu=gpu, what=off)
        await self.emit(
            ResetStep.PERSISTENCE, gpu=gpu, mode=0, exit_status=status, output=text[-300:]
        )
        try:
            return await self._gpu_reset(plan, gpu)
        finally:
            on = "persistence mode back on after the GPU reset"
            status, text = await self.smi("-pm", "1", "-i", str(gpu), gpu=gpu, what=on)
            await self.emit(
                ResetStep.PERSISTENCE, gpu=gpu, mode=1, exit_status=status, output=text[-300:]
            )

    async def _gpu_reset(self, plan: ResetPlan, gpu: int) -> tuple[GpuResult, ...]:
        what = "GPU reset"
        status, text = await self.smi("--gpu-reset", "-i", str(gpu), gpu=gpu, what=what)
        await self.emit(ResetStep.GPU_RESET, gpu=gpu, exit_status=status, output=text[-500:])
        # 14/15 (an infoROM warning, another GPU lost) still reset this one when it says so.
        done = status == 0 or (status in USABLE_EXIT and "was successfully reset" in text)
        if not done:
            obs = GpuObservation(gpu, None, False, error=f"nvidia-smi --gpu-reset: {text[:200]}")
            return (await conclude(self, plan, obs, None),)
        return await verify(self, plan, {}, {}, {})

    async def final_snapshot(self) -> NodeSnapshot | None:
        try:
            return await self.snapshot()
        except GpubotError:
            return self.last_snapshot
