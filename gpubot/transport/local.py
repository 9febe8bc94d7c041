"""The local transport: the box gpubot runs on (``host = "local"``).

Commands run without a shell, with SSH's timeout and error semantics: a missing program is exit
127, a timeout kills the whole process group (``CommandTimeout``), output past the cap kills it
(``ProbeError``). GPUs are read through NVML; without it, callers fall back to nvidia-smi.

NVML matches the nvidia-smi path: a lost GPU is one flagged row, never a failed node; a MIG GPU
lists its instances' processes; each GPU carries its device minor. Calls an old driver's library
lacks are remembered for the process's life, not asked on every probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import weakref
from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar

from gpubot.config import SshSettings
from gpubot.core.clock import within
from gpubot.core.models import CommandResult, ComputeApp, GpuInfo, NodeConfig
from gpubot.core.ports import NvmlTables
from gpubot.errors import CommandTimeout, ProbeError, SmiFailed, SmiMissing
from gpubot.transport.boundary import ErrorMap, map_errors
from gpubot.transport.ssh import (
    MAX_OUTPUT_BYTES,
    OutputCapped,
    capped,
    check_argv,
    describe,
    read_capped,
)

T = TypeVar("T")
MIB = 1024 * 1024
# NVML return codes (nvml.h; pynvml's NVML_ERROR_* constants).
_NOT_SUPPORTED, _NO_PERMISSION, _NOT_FOUND = 3, 4, 6
# Codes that mean "this value is not available", not "NVML is broken".
_NOT_AVAILABLE = (_NOT_SUPPORTED, _NO_PERMISSION, _NOT_FOUND)
_LIBRARY_NOT_FOUND = 12
_GPU_IS_LOST = 15  # fell off the bus: nothing more can be read of that GPU
_RESET_REQUIRED = 16
# FUNCTION_NOT_FOUND (13): the driver's library lacks the symbol (an old driver);
# ARGUMENT_VERSION_MISMATCH (25): it lacks that version of the call's struct.
_NO_SUCH_CALL = (13, 25)
_MIG_ENABLE = 1  # NVML_DEVICE_MIG_ENABLE, nvmlDeviceGetMigMode's current mode
_MEMORY_V2 = "nvmlDeviceGetMemoryInfo_v2"
# pynvml's unversioned call is v3, which older drivers lack: it then raises
# NVMLLibraryMismatchError (no NVMLError), so the versions are asked for by name, newest first.
_PROCESS_CALLS = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
)
# The calls each pynvml-like module lacks in this process. The library is loaded once per
# process and does not grow functions, so a missing one is asked once, not on every probe.
_MISSING: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


class LocalTransport:
    """Runs argv lists on this box and reads its GPUs through NVML (implements ``Transport``)."""

    def __init__(
        self,
        ssh: SshSettings | None = None,
        *,
        nvml: Any = None,
        max_output_bytes: int = MAX_OUTPUT_BYTES,
    ) -> None:
        self._ssh = ssh or SshSettings()
        self._max_output = max_output_bytes
        self._nvml = nvml  # a pynvml-like module; None: import pynvml when first needed
        self._nvml_absent = False

    async def run(
        self, node: NodeConfig, argv: Sequence[str], *, timeout: float | None = None
    ) -> CommandResult:
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
        assert proc.stdout is not None and proc.stderr is not None
        ending: ErrorMap = {
            OutputCapped: (ProbeError, capped(args, self._max_output)),
            TimeoutError: (CommandTimeout, f"{describe(args)}: no answer in {limit:g}s (killed)"),
        }
        try:
            with map_errors(node.name, ending):
                async with asyncio.timeout(limit):
                    out, err = await read_capped(proc.stdout, proc.stderr, self._max_output)
                    await proc.wait()
        except BaseException:  # given up on (the output cap, the deadline, a cancellation)
            await _end(proc)
            raise
        rc = proc.returncode
        assert rc is not None
        status = 128 - rc if rc < 0 else rc  # killed by signal N: 128 + N, as a shell says
        return CommandResult(args, status, out, err)

    async def nvml_snapshot(self, node: NodeConfig) -> NvmlTables | None:
        """Return NVML's tables, or None to fall back to nvidia-smi."""
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
        pass  # nothing is pooled locally


async def _end(proc: asyncio.subprocess.Process) -> None:
    """Kill the command's process group (its own session) and reap it, reading its pipes to
    their end: a read stopped at the cap leaves a pipe transport open until collected."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        await within(proc.communicate(), 5)


def _import_pynvml(node: str) -> Any:
    with map_errors(
        node, {ImportError: (SmiMissing, "NVML bindings (nvidia-ml-py) not installed")}
    ):
        import pynvml
    return pynvml


def nvml_query(node: str = "local", *, nvml: Any = None) -> NvmlTables:
    """Read every GPU and compute process through NVML; SmiMissing when NVML is absent, a lost
    GPU a flagged row of unknowns, any other NVML error SmiFailed."""
    lib = nvml if nvml is not None else _import_pynvml(node)
    try:
        lib.nvmlInit()
    except lib.NVMLError as exc:
        if getattr(exc, "value", None) == _LIBRARY_NOT_FOUND:
            raise SmiMissing(node, "NVML library (libnvidia-ml) not found") from exc
        raise SmiFailed(node, f"NVML init failed: {exc}") from exc
    except OSError as exc:
        raise SmiMissing(node, f"NVML library cannot be loaded: {exc}") from exc
    r = _Reader(node, lib)
    failed: ErrorMap = {e: (SmiFailed, lambda exc: f"NVML: {exc}") for e in r.errors}
    try:
        gpus: list[GpuInfo] = []
        apps: list[ComputeApp] = []
        with map_errors(node, failed):
            for i in range(int(lib.nvmlDeviceGetCount())):
                gpu, on_it = _read_gpu(r, i)
                gpus.append(gpu)
                apps.extend(on_it)
        return tuple(gpus), tuple(apps)
    finally:
        with contextlib.suppress(Exception):
            lib.nvmlShutdown()


def missing_functions(nvml: Any = None) -> frozenset[str]:
    """Return the NVML functions this process found missing (asked once, then skipped)."""
    lib = nvml if nvml is not None else _import_pynvml("local")
    return frozenset(_missing_set(lib))


class _Lost(Exception):
    """NVML said NVML_ERROR_GPU_IS_LOST in one GPU's reads: what was read of it is dropped."""


_ABSENT = object()  # the function is not in this process's NVML (or a pynvml too old to wrap it)


class _Reader:
    """One ``nvml_query``'s calls: sorts NVML's errors per GPU, remembers missing functions."""

    def __init__(self, node: str, lib: Any) -> None:
        self.node = node
        self.lib = lib
        mismatch = getattr(lib, "NVMLLibraryMismatchError", None)  # pynvml's "no such version"
        extra = (
            (mismatch,) if isinstance(mismatch, type) and issubclass(mismatch, Exception) else ()
        )
        self.errors: tuple[type[Exception], ...] = (lib.NVMLError, *extra)
        self.missing = _missing_set(lib)
        self.flags: list[str] = []  # the current GPU's

    def flag(self, flag: str) -> None:  # on the current GPU
        if flag not in self.flags:
            self.flags.append(flag)

    def call(
        self,
        name: str,
        *args: Any,
        key: str = "",
        quiet: Collection[int] = _NOT_AVAILABLE,
        **kwargs: Any,
    ) -> Any:
        """Return ``lib.name(*args)``: None when unknown, _ABSENT when no such call; _Lost when
        the GPU is lost."""
        key = key or name
        fn = getattr(self.lib, name, None)
        if key in self.missing or not callable(fn):
            return _ABSENT
        try:
            return fn(*args, **kwargs)
        except self.errors as exc:
            if not isinstance(exc, self.lib.NVMLError):  # pynvml's "no such version here"
                self.missing.add(key)
                return _ABSENT
            code = getattr(exc, "value", None)
            if code == _GPU_IS_LOST:
                raise _Lost(name) from exc
            if code == _RESET_REQUIRED:
                self.flag("requires-reset")
                return None
            if code in _NO_SUCH_CALL:
                self.missing.add(key)  # the loaded library will not grow it: never ask again
                return _ABSENT
            if code in quiet:
                return None
            raise

    def need(self, name: str, *args: Any, quiet: Collection[int] = ()) -> Any:
        """Like ``call``, but a function this NVML lacks fails the query (nvidia-smi says it)."""
        got = self.call(name, *args, quiet=quiet)
        if got is _ABSENT:
            raise SmiFailed(self.node, f"NVML: {name} is not in this driver's library")
        return got

    def value(self, name: str, *args: Any) -> Any:
        """Return ``lib.name(*args)``, or None when unknown or not in this NVML."""
        got = self.call(name, *args)
        return None if got is _ABSENT else got

    def processes(self, h: Any, *, quiet: Collection[int] = ()) -> list[Any] | None:
        """Return the compute processes on ``h`` (newest call this NVML has); None: unknown."""
        for name in _PROCESS_CALLS:
            got = self.call(name, h, quiet=quiet)
            if got is not _ABSENT:
                return None if got is None else list(got)
        raise SmiFailed(self.node, "NVML: no compute-process call in this driver's library")


def _read_gpu(r: _Reader, i: int) -> tuple[GpuInfo, list[ComputeApp]]:
    """Return GPU ``i``'s row and compute apps; a lost GPU is a row of unknowns."""
    r.flags = []
    try:
        h = r.lib.nvmlDeviceGetHandleByIndex(i)
    except r.lib.NVMLError as exc:
        code = getattr(exc, "value", None)
        if code == _GPU_IS_LOST:
            return _unknown(i, None, None, "lost"), []  # no handle: not even its bus id
        if code == _RESET_REQUIRED:
            return _unknown(i, None, None, "requires-reset"), []
        raise
    try:
        return _read_handle(r, i, h)
    except _Lost:
        return _unknown(
            i, _quietly(r, lambda: _bus_id(r, h)), _quietly(r, lambda: _minor(r, h)), "lost"
        ), []


def _read_handle(r: _Reader, i: int, h: Any) -> tuple[GpuInfo, list[ComputeApp]]:
    index = r.value("nvmlDeviceGetIndex", h)
    uuid = r.need("nvmlDeviceGetUUID", h)
    name = r.need("nvmlDeviceGetName", h)
    used, total = _memory(r, h)
    util = r.value("nvmlDeviceGetUtilizationRates", h)  # NOT_SUPPORTED in MIG mode
    mode = r.value("nvmlDeviceGetMigMode", h)  # (current, pending); NOT_SUPPORTED: no MIG
    mig = mode is not None and int(mode[0]) == _MIG_ENABLE
    if mig:
        r.flag("mig")
    # In MIG mode the parent's list may leave out the instances' processes (it is an aggregate
    # only for privileged callers): each instance is read too, below.
    listed = r.processes(h, quiet=(_NOT_SUPPORTED, _NO_PERMISSION) if mig else ())
    uuid_text = "" if uuid is None else _text(uuid)
    apps = [_app(p, uuid_text) for p in listed or ()]
    if mig:
        apps += _instance_apps(r, h, uuid_text, {a.pid for a in apps})
    gpu = GpuInfo(
        index=i if index is None else int(index),
        uuid=uuid_text,
        name="?" if name is None else _text(name),
        memory_used_mib=used,
        memory_total_mib=total,
        utilization_pct=None if util is None else int(util.gpu),
        bus_id=_bus_id(r, h),
        minor=_minor(r, h),  # the device file's minor: a GPU's index is not its minor
        flags=tuple(r.flags),
    )
    # Without its uuid a GPU's processes cannot be told apart from another's: none listed.
    return gpu, apps if uuid_text else []


def _instance_apps(r: _Reader, h: Any, uuid: str, listed: set[int]) -> list[ComputeApp]:
    """Return the processes of a MIG GPU's instances not on the parent's list, as the parent's."""
    count = r.need("nvmlDeviceGetMaxMigDeviceCount", h)
    apps: list[ComputeApp] = []
    for j in range(int(count or 0)):
        mig = r.need("nvmlDeviceGetMigDeviceHandleByIndex", h, j, quiet=(_NOT_FOUND,))
        if mig is None:
            continue  # an empty slot
        for p in r.processes(mig) or ():
            if int(p.pid) not in listed:  # a process on two instances counts on each
                apps.append(_app(p, uuid))
    return apps


def _app(p: Any, uuid: str) -> ComputeApp:
    mem = p.usedGpuMemory  # no nvmlSystemGetProcessName: the name is the process's own say
    return ComputeApp(
        pid=int(p.pid), gpu_uuid=uuid, used_memory_mib=None if mem is None else int(mem) // MIB
    )


def _memory(r: _Reader, h: Any) -> tuple[int | None, int | None]:
    """Return (used, total) MiB as nvidia-smi shows them (v2 excludes reserved memory)."""
    info: Any = _ABSENT
    v2 = getattr(r.lib, "nvmlMemory_v2", None)
    if v2 is not None:
        info = r.call("nvmlDeviceGetMemoryInfo", h, key=_MEMORY_V2, version=v2)
    if info is None or info is _ABSENT:
        info = r.call("nvmlDeviceGetMemoryInfo", h)
    if info is None or info is _ABSENT:
        return None, None
    return int(info.used) // MIB, int(info.total) // MIB


def _bus_id(r: _Reader, h: Any) -> str | None:
    pci = r.value("nvmlDeviceGetPciInfo", h)
    return None if pci is None else _text(pci.busId)


def _minor(r: _Reader, h: Any) -> int | None:
    minor = r.value("nvmlDeviceGetMinorNumber", h)
    return None if minor is None else int(minor)


def _quietly(r: _Reader, read: Callable[[], T]) -> T | None:
    """Return ``read()``, or None on any NVML error: what can still be said of a lost GPU."""
    errors: tuple[type[Exception], ...] = (_Lost, SmiFailed, *r.errors)
    try:
        return read()
    except errors:
        return None


def _unknown(i: int, bus: str | None, minor: int | None, flag: str) -> GpuInfo:
    return GpuInfo(i, "", "?", None, None, None, bus, minor, (flag,))


def _missing_set(lib: Any) -> set[str]:
    try:
        return _MISSING.setdefault(lib, set())
    except TypeError:  # not weakly referable: nothing to remember it by
        return set()


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
