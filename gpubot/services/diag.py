"""``/gpu diag NODE gpu N [quick|medium]``: DCGM's diagnostic on one GPU, audited.

intent → ``timeout -k 5 T dcgmi diag -r 1|2 -i N -j`` over the node's transport → outcome. The
intent is written before anything goes out (fail closed). No ``sudo``: dcgmi is a client of
nv-hostengine, which runs the tests. Where DCGM is missing (no ``dcgmi``, or no nv-hostengine
answering) the answer is one line saying which, recorded as the action's error; so is a run
stopped at its time limit and a document that cannot be read. Who may ask is the caller's to
decide (``RequestService``: the same check as a reset's).
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from gpubot.config import Settings
from gpubot.core.health.diag import (
    EXIT_TIMEOUT,
    LEVELS,
    DiagReport,
    DiagResult,
    DiagUnreadable,
    clean,
    diag_argv,
    missing,
    parse_diag,
)
from gpubot.core.models import ActionStatus
from gpubot.core.ports import AuditStore, Locks, Transport
from gpubot.errors import GpubotError, UsageError
from gpubot.services.reset import Ask
from gpubot.services.status import StatusService

MARGIN_S = 30.0  # the transport waits this much past dcgmi's own limit (timeout -k, SSH)


class DiagFailed(GpubotError):
    """The diagnostic did not run to a result (DCGM missing, stopped at its limit, unreadable)."""


@dataclass(frozen=True)
class DiagRun:
    """A diagnostic that ran: the document as read, for ``gpu``."""

    node: str
    gpu: int
    level: str
    report: DiagReport
    exit_status: int
    action_id: int

    @property
    def rows(self) -> tuple[DiagResult, ...]:
        return self.report.for_gpu(self.gpu)

    @property
    def verdict(self) -> str:
        return self.report.verdict(self.gpu)

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "gpu": self.gpu,
            "level": self.level,
            "verdict": self.verdict,
            "dcgm_version": self.report.version,
            "runtime_error": self.report.runtime_error,
            "exit_status": self.exit_status,
            "tests": [r.to_dict() for r in self.rows],
        }


def diag_lock(node: str) -> str:
    """The lease one diagnostic on ``node`` holds (DCGM runs one at a time)."""
    return f"diag:{node}"


class DiagService:
    """Runs ``dcgmi diag`` on one GPU of a node, each run audited."""

    def __init__(
        self,
        settings: Settings,
        transport: Transport,
        store: AuditStore,
        status: StatusService,
        locks: Locks,
    ) -> None:
        self.settings = settings
        self.transport = transport
        self.store = store
        self.status = status
        self.locks = locks

    def limit_s(self, level: str) -> float:
        r = self.settings.reset
        return r.diag_quick_s if level == "quick" else r.diag_medium_s

    async def run(self, ask: Ask, node_name: str, gpu: int, level: str = "quick") -> DiagRun:
        """Run the diagnostic as ``ask`` asks; ``DiagFailed`` (one line) if it gave no result."""
        if level not in LEVELS:
            raise UsageError(f"diag level must be quick or medium, not {level!r}")
        node = self.status.node(node_name)
        limit = self.limit_s(level)
        argv = diag_argv(gpu, LEVELS[level], limit)
        async with self.locks.hold(diag_lock(node.name), holder=ask.who.id) as lease:
            intent: dict[str, Any] = {"gpu": gpu, "level": level, "argv": argv, "limit_s": limit}
            if lease.took_over is not None:
                intent["lease"] = {"took_over": lease.took_over}
            action_id = await self.store.begin_action(
                kind="diag",
                actor=ask.who.id,
                source=ask.source,
                command=ask.command,
                node=node.name,
                gpus=(gpu,),
                plan=intent,
                fence=lease.fence,
            )
            try:
                res = await self.transport.run(node, argv, timeout=limit + MARGIN_S)
                done = self._read(node.name, gpu, level, res.exit_status, res, limit, action_id)
                await self.store.finish_action(
                    action_id, status=ActionStatus.DONE, result=done.to_dict(), fence=lease.fence
                )
                return done
            except BaseException as exc:
                doc = {"error": str(exc) or type(exc).__name__, "node": node.name, "gpu": gpu}
                with suppress(GpubotError):  # not fenced: it records what happened
                    await self.store.finish_action(action_id, status=ActionStatus.ERROR, result=doc)
                if isinstance(exc, DiagFailed):
                    raise DiagFailed(f"{exc} (audit #{action_id})") from None
                raise

    def _read(
        self, node: str, gpu: int, level: str, status: int, res: Any, limit: float, aid: int
    ) -> DiagRun:
        out = (res.stdout + "\n" + res.stderr).strip()
        gone = missing(status, out)
        if gone is not None:
            raise DiagFailed(f"no diagnostic on {node}: {gone}")
        if status in EXIT_TIMEOUT:
            raise DiagFailed(f"dcgmi diag on {node} GPU {gpu} was stopped after {limit:g} s")
        try:
            report = parse_diag(res.stdout)
        except DiagUnreadable as exc:
            said = clean(res.stderr, 120)
            raise DiagFailed(
                f"dcgmi diag on {node} gave no result gpubot can read ({exc})"
                + (f"; it said: {said}" if said else "")
            ) from None
        return DiagRun(node, gpu, level, report, status, aid)
