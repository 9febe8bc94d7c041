"""Ports: what services need from the outside world (``typing.Protocol``)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, runtime_checkable

from gpubot.core.idle import GpuSample
from gpubot.core.models import CommandResult, ComputeApp, GpuInfo, NodeConfig


class Transport(Protocol):
    """Runs argv lists on nodes; raises ``TransportError`` subclasses, never library errors."""

    async def run(
        self, node: NodeConfig, argv: Sequence[str], *, timeout: float | None = None
    ) -> CommandResult:
        """Run ``argv`` on ``node`` (joined with ``shlex.join``) and return its result."""
        ...

    async def close(self) -> None:
        """Close every pooled connection."""
        ...


NvmlTables = tuple[tuple[GpuInfo, ...], tuple[ComputeApp, ...]]


@runtime_checkable
class NvmlReader(Protocol):
    """A transport that can also read a node's GPUs through NVML (the local box)."""

    async def nvml_snapshot(self, node: NodeConfig) -> NvmlTables | None:
        """Return NVML's GPU and compute-app tables, or None to fall back to nvidia-smi."""
        ...


class Locks(Protocol):
    """Named locks that are never waited for: a held lock raises ``LockHeld`` naming its holder."""

    def hold(self, name: str, *, holder: str = "") -> AbstractAsyncContextManager[None]:
        """Hold ``name`` for the block or raise ``LockHeld`` at once."""
        ...


class Clock(Protocol):
    """Time, passed in so that tests and the core can reason about it.

    Wall time (``now``) is what is recorded and shown; deadlines and durations use
    ``monotonic``. The default everywhere is ``gpubot.core.clock.SYSTEM_CLOCK``.
    """

    def now(self) -> float:
        """Return unix time in seconds."""
        ...

    def monotonic(self) -> float:
        """Return a monotonic time in seconds."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``."""
        ...


class AuditStore(Protocol):
    """The append-only, hash-chained audit log. Every method raises ``StoreError`` on failure."""

    async def begin_action(
        self,
        *,
        kind: str,
        actor: str,
        source: str,
        command: str,
        node: str | None,
        gpus: Sequence[int],
        plan: Mapping[str, Any] | None,
    ) -> int:
        """Write the intent of an action BEFORE anything happens; return the action id."""
        ...

    async def record_event(self, action_id: int, event: Mapping[str, Any]) -> None:
        """Append one step of an action (signal sent, process exited, GPU outcome ...)."""
        ...

    async def finish_action(
        self, action_id: int, *, status: str, result: Mapping[str, Any]
    ) -> None:
        """Append the outcome of an action."""
        ...

    async def record_query(
        self,
        *,
        kind: str,
        actor: str,
        source: str,
        nodes: Sequence[str],
        failed: Mapping[str, str],
        seconds: float,
    ) -> None:
        """Append a brief record of a read-only query (status, sweep)."""
        ...


class SampleStore(Protocol):
    """Per-GPU utilisation and memory samples, one per GPU per sweep (``core.idle``).

    Every method raises ``StoreError`` on failure.
    """

    async def add_samples(self, samples: Sequence[GpuSample]) -> None:
        """Store one sweep's samples (one batched insert)."""
        ...

    async def samples_since(
        self, since: float, *, gpus: Collection[tuple[str, int]] | None = None
    ) -> list[GpuSample]:
        """Return the samples taken at or after ``since`` (of ``gpus``: (node, index) only),
        by node, GPU and time."""
        ...

    async def prune_samples(self, before: float) -> int:
        """Delete the samples taken before ``before``; return how many went."""
        ...


class ResetObserver(Protocol):
    """Counts resets by how each GPU ended (the metrics): ``freed``, ``stuck``, ``refused``..."""

    def count_reset(self, outcome: str, n: int = 1) -> None:
        """Count ``n`` GPUs that ended ``outcome``."""
        ...
