"""Reset latency: from the request to ``freed``, split where the time goes.

A ``normal`` (exits on SIGTERM) and a ``stubborn`` (ignores it: SIGKILL after the grace period)
workload are reset in turn on one simulated node, through the real engine (``ResetService``
over SSH, audit in SQLite). One timeline per reset, from clocks on the same machine:

- request: before ``engine.plan``;        planned: the ``planned`` event (audit intent written);
- signalled: the first ``signal`` event (the SIGTERM exec came back);
- died: when the process died, as the sim's driver saw it (a pidfd, not a poll);
- released: ``died + release delay``, when the sim gives the memory back;
- freed: the ``gpu_outcome`` event that says ``freed``.

The sim's release delay is the base delay plus a part of one poll interval that changes every
repeat (see ``measure``). Segments: planning = planned - request; signalling = signalled -
planned; waiting for exit = died - signalled (0 if it died before the signal exec returned; for
stubborn it holds the grace period and SIGKILL); release = released - max(died, signalled);
verification overhead = freed - released, i.e. what gpubot adds beyond the sim's own delays,
to be within one poll interval.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.experiments import patched
from gpubot.config import Settings, load
from gpubot.core.models import Outcome
from gpubot.core.reset.plan import ResetRequest
from gpubot.services.reset import Ask, NodeLocks, ResetService
from gpubot.services.status import StatusService
from gpubot.store import open_store
from gpubot.transport import make_transport
from gpusim.fleet import SimFleet

SEGMENTS = ("planning", "signalling", "exit", "release", "overhead", "total")
BEHAVIOURS = ("normal", "stubborn")


@dataclass
class ResetRun:
    """The timeline of one reset, in seconds from the request."""

    behaviour: str
    segments: dict[str, float]
    outcome: str
    signals: list[str]


@dataclass
class ResetSeries:
    """All runs of one behaviour."""

    behaviour: str
    runs: list[ResetRun] = field(default_factory=list)

    def median(self, seg: str) -> float | None:
        """Return the median of one segment over the runs that ended freed."""
        vals = [r.segments[seg] for r in self.runs if r.outcome == Outcome.FREED.value]
        return statistics.median(vals) if vals else None

    def max(self, seg: str) -> float | None:
        """Return the largest value of one segment over the freed runs."""
        vals = [r.segments[seg] for r in self.runs if r.outcome == Outcome.FREED.value]
        return max(vals) if vals else None


def _label(behaviour: str, experiment: str) -> str:
    return f"{behaviour} + {experiment}" if experiment else behaviour


def reset_settings(fleet: SimFleet, grace_s: float, poll_s: float | None) -> Settings:
    """Load the fleet's settings with a short grace period (and, if given, a poll interval)."""
    s = load(fleet.config_path)
    poll = s.reset.poll_interval_s if poll_s is None else poll_s
    return dataclasses.replace(
        s, reset=dataclasses.replace(s.reset, grace_s=grace_s, poll_interval_s=poll)
    )


async def one_reset(
    engine: ResetService, fleet: SimFleet, behaviour: str, user: str | None
) -> ResetRun:
    """Spawn a ``behaviour`` workload on GPU 0 of node1, reset it, return its timeline."""
    node = fleet.nodes[0]
    w = node.spawn(gpu=0, mib=4096, behaviour=behaviour, user=user)
    requester = user or fleet.user
    t0 = time.time()
    plan, before = await engine.plan(ResetRequest(node.name, requester, gpus=(0,)))
    result = await engine.execute(
        plan, Ask.by("bench", "bench", f"bench reset {behaviour}"), before=before
    )
    alloc = next(a for a in node.state()["allocations"] if a["pid"] == w.pid)
    steps = {s.kind: s for s in reversed(result.steps)}  # the first of each kind
    planned = steps["planned"].at
    signalled = steps["signal"].at
    freed = next(s.at for s in result.steps if s.kind == "gpu_outcome")
    died = float(alloc["died_at"]) if alloc["died_at"] is not None else freed
    released = float(alloc["released_at"]) if alloc["released_at"] is not None else freed
    seg = {
        "planning": planned - t0,
        "signalling": signalled - planned,
        "exit": max(0.0, died - signalled),
        "release": released - max(died, signalled),
        "overhead": freed - released,
        "total": freed - t0,
    }
    signals = [
        str(s.data["signal"])
        for s in result.steps
        if s.kind == "signal" and s.data["result"] == "sent"
    ]
    return ResetRun(behaviour, seg, result.gpus[0].outcome.value, signals)


async def measure(
    fleet: SimFleet,
    work: Path,
    repeat: int,
    grace_s: float,
    user: str | None,
    log: Callable[[str], None],
    experiments: Sequence[str] = (),
) -> tuple[dict[str, ResetSeries], dict[str, Any]]:
    """Reset a normal and a stubborn workload ``repeat`` times each (and under each experiment).

    Series are keyed ``behaviour`` or ``behaviour + experiment``; all of them alternate.
    """
    settings = reset_settings(fleet, grace_s, None)
    store = open_store(f"sqlite:///{work}/reset-audit.db", check_schema=False)
    store.upgrade()
    transport = make_transport(settings.ssh)
    status = StatusService(settings, transport, store)
    engine = ResetService(settings, transport, store, status, NodeLocks())
    cases = [(b, e) for e in ("", *experiments) for b in BEHAVIOURS]
    series = {_label(b, e): ResetSeries(_label(b, e)) for b, e in cases}
    try:
        await status.fleet([fleet.nodes[0].name])  # connect first: a bot's connection is warm
        base_delay = fleet.nodes[0].release_delay_s
        poll = settings.reset.poll_interval_s
        for r in range(repeat):
            # The release delay sweeps one poll interval (golden-ratio steps): with a delay that
            # is a multiple of the interval, polls paced from the signal would land right on the
            # release and flatter the overhead. Every case of one repeat gets the same delay.
            fleet.nodes[0].release_delay_s = base_delay + poll * ((r + 1) * 0.6180339887 % 1.0)
            order = cases[r % len(cases) :] + cases[: r % len(cases)]
            for b, e in order:
                with patched(e):
                    run = await one_reset(engine, fleet, b, user)
                series[_label(b, e)].runs.append(run)
                s = run.segments
                log(
                    f"  reset {_label(b, e):<18} {r + 1}/{repeat}: {run.outcome:<8}"
                    f" total {s['total']:.3f} s"
                    f" (plan {s['planning']:.3f}, signal {s['signalling']:.3f},"
                    f" exit {s['exit']:.3f}, release {s['release']:.3f},"
                    f" overhead {s['overhead']:.3f}) {run.signals}"
                )
    finally:
        await transport.close()
        store.close()
    fleet.nodes[0].release_delay_s = base_delay
    info = {
        "experiments": list(experiments),
        "poll_interval_s": settings.reset.poll_interval_s,
        "grace_s": grace_s,
        "release_delay_s": base_delay,
    }
    return series, info
