"""One reset in progress: SIGTERM → grace → SIGKILL → verify, or ``nvidia-smi --gpu-reset``.

Every step is recorded in the audit log before it is reported (a failure to record stops the
reset). Only planned processes are signalled, each after an identity check on the node.

The reset runs under the node's lease (``core.lease``): every record is fenced (the store checks
the lease in the write's transaction), and before each signal or command the lease is checked
and a ``sending`` step is written, so a holder that lost its lease stops before its next signal.
"""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpubot.core.cutoff import Sent, sent_items
from gpubot.core.lease import Lease
from gpubot.core.models import NodeConfig, NodeSnapshot, ResetStep
from gpubot.core.nvsmi import USABLE_EXIT
from gpubot.core.outcome import GpuObservation, GpuResult, Survivor
from gpubot.core.plan import ResetPlan
from gpubot.core.signals import Identity, PidReport, PidStatus, parse_signal_output, signal_argv
from gpubot.core.timefmt import iso
from gpubot.core.workload import Workload
from gpubot.errors import GpubotError
from gpubot.services.verify import Pairs, conclude, verify
from gpubot.services.workloads import after_respawn

if TYPE_CHECKING:
    from gpubot.services.reset import ResetService


@dataclass(frozen=True)
class ResetEvent:
    """One step of a reset, as it happens (``ResetStep``: planned, signal, exited, ...)."""

    kind: ResetStep
    at: float
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready form."""
        return {"kind": self.kind, "at": iso(self.at, timespec="milliseconds"), **self.data}


EventSink = Callable[[ResetEvent], Awaitable[None]]


class ResetRun:
    """State of one reset in progress: its steps, and how it talks to the node."""

    def __init__(
        self,
        svc: ResetService,
        node: NodeConfig,
        action_id: int,
        sink: EventSink | None,
        lease: Lease | None = None,
    ) -> None:
        self.svc = svc
        self.node = node
        self.action_id = action_id
        self.sink = sink
        self.cfg = svc.settings.reset
        self.steps: list[ResetEvent] = []
        self.last_snapshot: NodeSnapshot | None = None
        self.refused: dict[int, str] = {}  # planned pids the node's identity check refused, why
        self.respawned: dict[int, Workload] = {}  # GPU -> the workload that took it again
        self.lease = lease
        self.alive_at: dict[int, str] = {}  # target pid -> when a check last saw it alive

    async def emit(self, kind: ResetStep, **data: Any) -> None:
        """Record a step in the audit log first (a failure stops the reset), then report it."""
        event = ResetEvent(kind, self.svc.clock.now(), data)
        self.steps.append(event)
        fence = None if self.lease is None else self.lease.fence
        await self.svc.store.record_event(self.action_id, event.to_dict(), fence=fence)
        if self.sink is not None:
            await self.sink(event)

    async def before_sending(self, **what: Any) -> None:
        """Check the lease, then record what is about to go out (fenced): raise if it is gone.

        The check here is what the renewal found (lost, or run out while the database did not
        answer); the fenced write then asks the database itself.
        """
        if self.lease is not None:
            self.lease.check()
        await self.emit(ResetStep.SENDING, **what)

    def sent(self) -> list[Sent]:
        """Return the signals and commands that went out so far, and what is known since."""
        return sent_items([s.to_dict() for s in self.steps], self.alive_at)

    async def signal(self, sig: str, ids: Sequence[Identity]) -> dict[int, PidReport]:
        """Signal (or check) planned processes, identity checked on the node."""
        if not ids:
            return {}
        argv = signal_argv(sig, ids, sudo=self.node.sudo)
        res = await self.svc.transport.run(
            self.node, argv, timeout=self.svc.settings.ssh.command_timeout_s
        )
        return parse_signal_output(res.stdout)

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
        """SIGTERM the targets, SIGKILL those alive after ``grace_s``, then verify."""
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
        clock = self.svc.clock
        deaths: dict[int, float] = {}
        alive = await self.send("TERM", pairs, deaths)
        alive = await self.wait_gone(alive, pairs, deaths, clock.monotonic() + grace_s)
        last: dict[int, PidReport] = {}
        if alive:
            alive = await self.send("KILL", {p: pairs[p] for p in alive}, deaths)
            kill_wait = min(5.0, self.cfg.verify_timeout_s)
            alive = await self.wait_gone(alive, pairs, deaths, clock.monotonic() + kill_wait)
            last = await self.signal("check", _ids(pairs, alive))
        survivors = {
            p: Survivor(p, r.state, r.wchan) for p, r in last.items() if r.status == PidStatus.ALIVE
        }
        return await verify(self, plan, pairs, deaths, survivors)

    async def send(self, sig: str, pairs: Pairs, deaths: dict[int, float]) -> set[int]:
        """Send ``sig`` to each planned process; return the PIDs it reached."""
        if pairs:
            await self.before_sending(signal=f"SIG{sig}", pids=sorted(pairs))
        reports = await self.signal(sig, _ids(pairs, pairs))
        reached: set[int] = set()
        for pid, rep in sorted(reports.items()):
            why = rep.why
            if why is None:
                await self.emit(ResetStep.SIGNAL, pid=pid, signal=f"SIG{sig}", result=rep.status)
            else:
                self.refused[pid] = why
                await self.emit(
                    ResetStep.SIGNAL, pid=pid, signal=f"SIG{sig}", result=rep.status, why=why
                )
            if rep.status == PidStatus.SENT:
                reached.add(pid)
            elif rep.status == PidStatus.GONE:
                deaths.setdefault(pid, self.svc.clock.monotonic())
        return reached

    async def wait_gone(
        self, alive: set[int], pairs: Pairs, deaths: dict[int, float], deadline: float
    ) -> set[int]:
        """Poll until every PID in ``alive`` is gone or the (monotonic) deadline passes."""
        clock = self.svc.clock
        alive = set(alive)
        while alive and clock.monotonic() < deadline:
            await clock.sleep(self.cfg.poll_interval_s)
            reports = await self.signal("check", _ids(pairs, alive))
            now = clock.monotonic()
            for pid in sorted(alive):
                rep = reports.get(pid)
                if rep is not None and rep.status == PidStatus.ALIVE:
                    self.alive_at[pid] = iso(clock.now(), timespec="milliseconds")
                else:
                    alive.discard(pid)
                    deaths[pid] = now
                    await self.emit(ResetStep.EXITED, pid=pid)
        return alive

    async def smi(self, *args: str) -> tuple[int, str]:
        """Run a privileged ``nvidia-smi ARGS`` (``sudo -n`` where configured); return its say."""
        await self.before_sending(command=shlex.join(["nvidia-smi", *args]))
        argv = [self.node.nvidia_smi, *args]
        if self.node.sudo:
            argv = ["sudo", "-n", *argv]
        res = await self.svc.transport.run(
            self.node, argv, timeout=self.svc.settings.ssh.command_timeout_s
        )
        return res.exit_status, (res.stdout + res.stderr).strip()

    async def gpu_reset(
        self, plan: ResetPlan, gpu: int, *, toggle: bool = False
    ) -> tuple[GpuResult, ...]:
        """Run ``nvidia-smi --gpu-reset -i N`` and verify the GPU's memory is back.

        ``toggle``: persistence mode off before (the daemon lets the GPU go) and on after.
        """
        if not toggle:
            return await self._gpu_reset(plan, gpu)
        status, text = await self.smi("-pm", "0", "-i", str(gpu))
        await self.emit(
            ResetStep.PERSISTENCE, gpu=gpu, mode=0, exit_status=status, output=text[-300:]
        )
        try:
            return await self._gpu_reset(plan, gpu)
        finally:
            status, text = await self.smi("-pm", "1", "-i", str(gpu))
            await self.emit(
                ResetStep.PERSISTENCE, gpu=gpu, mode=1, exit_status=status, output=text[-300:]
            )

    async def _gpu_reset(self, plan: ResetPlan, gpu: int) -> tuple[GpuResult, ...]:
        status, text = await self.smi("--gpu-reset", "-i", str(gpu))
        await self.emit(ResetStep.GPU_RESET, gpu=gpu, exit_status=status, output=text[-500:])
        # 14/15 (an infoROM warning, another GPU lost) still reset this one when it says so.
        done = status == 0 or (status in USABLE_EXIT and "was successfully reset" in text)
        if not done:
            obs = GpuObservation(gpu, None, False, error=f"nvidia-smi --gpu-reset: {text[:200]}")
            return (await conclude(self, plan, obs, None),)
        return await verify(self, plan, {}, {}, {})

    async def final_snapshot(self) -> NodeSnapshot | None:
        """Take a full snapshot for the after table; None if the node does not answer."""
        try:
            return await self.svc.status.snapshot(self.node)
        except GpubotError:
            return self.last_snapshot


def _ids(pairs: Pairs, pids: Iterable[int]) -> list[Identity]:
    return [(p, *pairs[p]) for p in sorted(pids)]
