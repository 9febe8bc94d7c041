"""The local transport: the box gpubot runs on (``host = "local"``).

Commands run with ``asyncio.create_subprocess_exec`` (never a shell) with the same timeout and
error semantics as SSH: a missing program is exit 127, a timeout kills the command's whole process
group and raises ``CommandTimeout``. GPUs are read through NVML (``pynvml``); when NVML is missing
or fails, callers fall back to ``nvidia-smi`` through the probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Sequence
from typing import Any

from gpubot.config import SshSettings
from gpubot.core.models import CommandResult, ComputeApp, GpuInfo, NodeConfig
from gpubot.errors import CommandTimeout, ProbeError, SmiFailed, SmiMissing
from gpubot.ssh.transport import check_argv, describe

MIB = 1024 * 1024
# NVML return codes (nvml.h) that mean "this value is not available", not "NVML is broken".
_NOT_AVAILABLE = {3, 4, 6}  # NOT_SUPPORTED, NO_PERMISSION, NOT_FOUND
_LIBRARY_NOT_FOUND = 12
_FUNCTION_NOT_FOUND = 13


class LocalTransport:
    """Runs argv lists on this box and reads its GPUs through NVML (implements ``Transport``)."""

    def __init__(self, ssh: SshSettings | None = None, *, nvml: Any = None) -> None:
        self._ssh = ssh or SshSettings()
        self._nvml = nvml  # a pynvml-like module; None: import pynvml when first needed
        self._nvml_absent = False

    async def run(
        self, node: NodeConfig, argv: Sequence[str], *, timeout: float | None = None
    ) -> CommandResult:
        """Run ``argv`` here (no shell) and return its result."""
        check_argv(argv)
        limit = self._ssh.command_timeout_s if timeout is None else timeout
        args = tuple(argv)
        try:
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # its own process group, so a timeout can end it all
            )
        except FileNotFoundError:
            return CommandResult(args, 127, "", f"{args[0]}: not found\n")
        except PermissionError:
            return CommandResult(args, 126, "", f"{args[0]}: permission denied\n")
        except OSError as exc:
            return CommandResult(args, 126, "", f"{args[0]}: {exc.strerror or exc}\n")
        try:
            out, err = await asyncio.wait_for(proc.communicate(), limit)
        except TimeoutError:
            await _end(proc)
            raise CommandTimeout(
                node.name, f"{describe(args)}: no answer in {limit:g}s (killed)"
            ) from None
        except asyncio.CancelledError:
            await _end(proc)
            raise
        rc = proc.returncode
        assert rc is not None
        status = 128 - rc if rc < 0 else rc  # killed by signal N: 128 + N, as a shell says
        return CommandResult(
            args, status, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        )

    async def nvml_snapshot(
        self, node: NodeConfig
    ) -> tuple[tuple[GpuInfo, ...], tuple[ComputeApp, ...]] | None:
        """Return NVML's GPU and compute-app tables, or None to fall back to nvidia-smi."""
        if self._nvml_absent:
            return None
        try:
            lib = self._nvml if self._nvml is not None else _import_pynvml(node.name)
            return await asyncio.to_thread(nvml_query, node.name, nvml=lib)
        except SmiMissing:
            self._nvml_absent = True
            return None
        except ProbeError:
            return None  # nvidia-smi will say what is wrong, in its own words

    async def close(self) -> None:
        """Nothing is pooled locally."""


async def _end(proc: asyncio.subprocess.Process) -> None:
    """Kill the command's process group (ours: it was started in a new session) and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(proc.wait(), 5)


def _import_pynvml(node: str) -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise SmiMissing(node, "NVML bindings (nvidia-ml-py) not installed") from exc
    return pynvml


def nvml_query(
    node: str = "local", *, nvml: Any = None
) -> tuple[tuple[GpuInfo, ...], tuple[ComputeApp, ...]]:
    """Read every GPU and compute process through NVML; raise SmiMissing when NVML is absent."""
    lib = nvml if nvml is not None else _import_pynvml(node)
    try:
        lib.nvmlInit()
    except lib.NVMLError as exc:
        if getattr(exc, "value", None) == _LIBRARY_NOT_FOUND:
            raise SmiMissing(node, "NVML library (libnvidia-ml) not found") from exc
        raise SmiFailed(node, f"NVML init failed: {exc}") from exc
    except OSError as exc:
        raise SmiMissing(node, f"NVML library cannot be loaded: {exc}") from exc
    try:
        gpus: list[GpuInfo] = []
        apps: list[ComputeApp] = []
        for i in range(lib.nvmlDeviceGetCount()):
            h = lib.nvmlDeviceGetHandleByIndex(i)
            uuid = _text(lib.nvmlDeviceGetUUID(h))
            used, total = _memory(lib, h)
            gpus.append(
                GpuInfo(
                    index=int(lib.nvmlDeviceGetIndex(h)),
                    uuid=uuid,
                    name=_text(lib.nvmlDeviceGetName(h)),
                    memory_used_mib=used,
                    memory_total_mib=total,
                    utilization_pct=_optional(
                        lib, lambda h=h: lib.nvmlDeviceGetUtilizationRates(h).gpu
                    ),
                    bus_id=_optional(lib, lambda h=h: _text(lib.nvmlDeviceGetPciInfo(h).busId)),
                    # The device file's minor: a GPU's index is not its minor.
                    minor=_optional(lib, lambda h=h: int(lib.nvmlDeviceGetMinorNumber(h))),
                )
            )
            for p in lib.nvmlDeviceGetComputeRunningProcesses(h):
                mem = p.usedGpuMemory  # no nvmlSystemGetProcessName: the name is the process's say
                apps.append(
                    ComputeApp(
                        pid=int(p.pid),
                        gpu_uuid=uuid,
                        used_memory_mib=None if mem is None else int(mem) // MIB,
                    )
                )
        return tuple(gpus), tuple(apps)
    except lib.NVMLError as exc:
        raise SmiFailed(node, f"NVML: {exc}") from exc
    finally:
        with contextlib.suppress(Exception):
            lib.nvmlShutdown()


def _memory(lib: Any, h: Any) -> tuple[int | None, int | None]:
    """Return (used, total) MiB as nvidia-smi shows them (v2 excludes reserved memory)."""
    info: Any = None
    v2 = getattr(lib, "nvmlMemory_v2", None)
    if v2 is not None:
        try:
            info = lib.nvmlDeviceGetMemoryInfo(h, version=v2)
        except lib.NVMLError as exc:
            if getattr(exc, "value", None) not in (*_NOT_AVAILABLE, _FUNCTION_NOT_FOUND):
                raise
    if info is None:
        try:
            info = lib.nvmlDeviceGetMemoryInfo(h)
        except lib.NVMLError as exc:
            if getattr(exc, "value", None) in _NOT_AVAILABLE:
                return None, None
            raise
    return int(info.used) // MIB, int(info.total) // MIB


def _optional(lib: Any, read: Any) -> Any:
    """Return ``read()``, or None when NVML says the value is not available."""
    try:
        return read()
    except lib.NVMLError as exc:
        if getattr(exc, "value", None) in _NOT_AVAILABLE:
            return None
        raise


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
