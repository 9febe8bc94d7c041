"""The node probe: ONE remote exec that gathers everything a ``NodeSnapshot`` needs.

The scripts live in ``probe_script``: a constant ``sh`` script runs the GPU and compute-app queries
under ``timeout`` (a hung nvidia-smi becomes exit 124 and is killed), ``fuser -v`` on exactly the
device files of the GPUs found plus ``{prefix}ctl`` and ``{prefix}-uvm`` (never a glob), then reads
``/proc`` for every PID seen, escaping every byte a process controls about itself.

The output is parsed strictly: the sections must come exactly as the script writes them, in order
and once each; each PID once; every escaped field well formed. Anything else is a ``ParseError``
for the node, never a different table. A PID that vanishes mid-probe is simply absent.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpubot.core.models import (
    CommandResult,
    ComputeApp,
    DeviceHolder,
    GpuInfo,
    GpuProcess,
    NodeConfig,
    NodeSnapshot,
    ProcInfo,
)
from gpubot.core.nvsmi import (
    first_meaningful_line,
    normal_bus_id,
    parse_apps_answer,
    parse_gpu_answer,
)
from gpubot.core.probe_script import MARK, PROBE_SCRIPT, PROC_SCRIPT
from gpubot.core.protect import Protection, is_protected
from gpubot.core.workload import parse_cgroup
from gpubot.errors import ConfigError, ParseError, ProbeError, SmiFailed

# The section sequences the scripts can write, as words joined by spaces.
_PROBE_GRAMMAR = re.compile(
    r"probe (?:fatal end|stuck end"
    r"|gpus-err gpus (?:end|apps-err apps (?:end|minors fuser view procs end))"
    r"|minors fuser view procs end)"
)
_BUS_DIR = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_PROC_GRAMMAR = re.compile(r"procs end")
_MARKER = re.compile("\n" + re.escape(MARK) + " ([^\n]*)\n")
_ESCAPED = re.compile(r"=(?:[!-\[\]-~]|\\[0-3][0-7]{2})*")
_OCTAL = re.compile(r"\\([0-3][0-7]{2})")
_NUM = re.compile(r"[0-9]{1,12}")

_MISSING = {
    "no-timeout": "timeout (coreutils) not found on the node",
    "no-fuser": "fuser (psmisc) not found on the node",
    "no-sudo": "sudo not found on the node (its inventory entry says sudo = true)",
}


def probe_argv(
    node: NodeConfig,
    *,
    smi_timeout_s: float,
    gpu_indices: Sequence[int] | None = None,
    skip_smi: bool = False,
    pids: Sequence[int] = (),
    minors: Sequence[int] = (),
) -> list[str]:
    """Return the argv of the one-exec probe of ``node``.

    ``skip_smi`` (the local box read through NVML) needs ``gpu_indices``; ``pids`` are extra
    processes to read from ``/proc`` (NVML's compute apps), ``minors`` device minors NVML knows.
    """
    _check_prefix(node)
    if smi_timeout_s <= 0:
        raise ValueError(f"smi_timeout_s must be > 0, got {smi_timeout_s!r}")
    if skip_smi and gpu_indices is None:
        raise ValueError("skip_smi needs gpu_indices (from NVML)")
    idx = "" if gpu_indices is None else ",".join(str(_nonneg(i)) for i in gpu_indices)
    return [
        "sh",
        "-c",
        PROBE_SCRIPT,
        "gpubot-probe",
        node.nvidia_smi,
        node.dev_prefix,
        _seconds(smi_timeout_s),
        "sudo" if node.sudo else "-",
        "nvml" if skip_smi else "smi",
        idx,
        node.driver_dir,
        ",".join(str(_nonneg(m)) for m in minors),
        *(str(_nonneg(p)) for p in pids),
    ]


def proc_argv(pids: Sequence[int]) -> list[str]:
    """Return the argv that reads ``/proc`` for ``pids`` alone (parse with ``parse_procs``).

    Reading needs no privilege: this never runs under sudo.
    """
    return ["sh", "-c", PROC_SCRIPT, "gpubot-procs", *(str(_nonneg(p)) for p in pids)]


def parse_procs(text: str, pids: Sequence[int]) -> dict[int, ProcInfo]:
    """Parse the output of ``proc_argv(pids)``; a PID that vanished is absent; raise ParseError."""
    return _Sections.parse(text, _PROC_GRAMMAR, "process listing").procs(pids)


_ACCESS = re.compile(r"[.cefFrmM]{5}")
_PATH_LINE = re.compile(r"(?P<path>\S.*?):(?:\s+(?P<rest>.*))?")
_FUSER_NOISE = ("Cannot stat ", "Specified filename ")


def parse_fuser(text: str) -> tuple[DeviceHolder, ...]:
    """Parse ``fuser -v`` output (stdout and stderr merged, COMMAND optional); raise ParseError."""
    holders: list[DeviceHolder] = []
    path: str | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip() or line.startswith(_FUSER_NOISE):
            continue
        if line.split() == ["USER", "PID", "ACCESS", "COMMAND"]:
            continue
        if not line[0].isspace():
            m = _PATH_LINE.fullmatch(line)
            if m is None:
                raise ParseError("fuser line", raw)
            path = m["path"]
            entry = m["rest"]
            if not entry:
                continue
        else:
            entry = line.strip()
        if path is None:
            raise ParseError("fuser line (no file before it)", raw)
        parts = entry.split(None, 3)
        if len(parts) >= 2 and parts[1] == "kernel":  # a mount or swap use, not a process
            continue
        if len(parts) not in (3, 4) or not parts[1].isdigit() or not _ACCESS.fullmatch(parts[2]):
            raise ParseError("fuser line", raw)
        command = parts[3] if len(parts) == 4 else ""
        holders.append(DeviceHolder(path=path, pid=int(parts[1]), user=parts[0], access=parts[2],
                                    command=command))  # fmt: skip
    return tuple(holders)


def parse_probe(
    node: NodeConfig,
    result: CommandResult,
    taken_at: float,
    nvml: tuple[tuple[GpuInfo, ...], tuple[ComputeApp, ...]] | None = None,
    protection: Protection | None = None,
) -> NodeSnapshot:
    """Build the snapshot of ``node`` from the probe's result (and NVML's tables when given).

    ``protection`` marks the protected system daemons (``GpuProcess.system``).

    Raises ``SmiMissing``/``SmiFailed`` when nvidia-smi failed, ``ProbeError`` when the probe could
    not run, ``ParseError`` on output that cannot be parsed.
    """
    s = _Sections.parse(result.stdout, _PROBE_GRAMMAR, "probe output", result=result,
                        node=node.name)  # fmt: skip
    fatal = s.get("fatal")
    if fatal is not None:
        missing = fatal[0][0] if fatal[0] else "?"
        raise ProbeError(node.name, _MISSING.get(missing, f"probe stopped: {missing}"))
    probe_args = s.args("probe", 2)
    timeout_s = _float_or_none(probe_args[0])
    stuck = s.get("stuck")
    if stuck is not None:
        raise _stuck(node.name, stuck[1])
    asked_all = probe_args[1] == "-"
    notes: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()
    if nvml is not None:
        if "gpus" in s.kinds:
            raise ParseError("probe output (nvidia-smi ran on an NVML node)", "")
        gpus, apps = nvml
    else:
        if "gpus" not in s.kinds:
            raise ParseError("probe output (no gpus section)", "")
        gpus, said = parse_gpu_answer(node.name, *s.smi_answer("gpus"), timeout_s=timeout_s)
        apps = parse_apps_answer(node.name, *s.smi_answer("apps"), timeout_s=timeout_s)
        notes = said.lines()
        lost = tuple(bus or "?" for index, bus, _ in said.lost if index is None)
    minors = s.minors()
    gpus = _with_minors(sorted(gpus, key=lambda g: g.index), minors)
    by_uuid = {g.uuid: g.index for g in gpus}
    holders, unseen = s.fuser(node)

    # A holder is put on a GPU only through that GPU's minor (never index == minor); device files
    # of GPUs this probe did not ask about are known and left out.
    gpu_paths = {node.device(g.minor): g.index for g in gpus if g.minor is not None}
    other_gpus = {node.device(m) for m in minors.values() if m is not None}
    ctl_paths = {f"{node.dev_prefix}ctl", f"{node.dev_prefix}-uvm"}
    on_gpu: dict[tuple[int, int], DeviceHolder] = {}
    ctl_pids: set[int] = set()
    for h in holders:
        if h.path in gpu_paths:
            on_gpu.setdefault((h.pid, gpu_paths[h.path]), h)
        elif h.path in ctl_paths:
            ctl_pids.add(h.pid)
        elif h.path not in other_gpus:
            raise ParseError("fuser line (a file the probe did not ask about)", h.path)
    # The script reads /proc for the apps' PIDs, then fuser's, in that order: so must the output.
    procs = s.procs([a.pid for a in apps] + [h.pid for h in holders])

    visible: dict[tuple[int, int], GpuProcess] = {}
    for app in apps:
        if app.gpu_uuid not in by_uuid:
            if nvml is None and asked_all:  # every GPU was asked for
                raise ParseError("compute app on a GPU nvidia-smi did not list", app.gpu_uuid)
            continue
        key = (app.pid, by_uuid[app.gpu_uuid])
        prev = visible.get(key)
        mem = app.used_memory_mib
        if prev is not None:  # one process, several contexts on one GPU: add them up
            mem = (
                None if mem is None or prev.used_memory_mib is None else mem + prev.used_memory_mib
            )
        visible[key] = _gpu_process(app.pid, key[1], mem, True, key in on_gpu, procs.get(app.pid))
    # A hidden holder is a process nvidia-smi lists on NO GPU (another PID namespace, a leak).
    # CUDA opens every visible GPU's device file, so a job nvidia-smi lists on GPU 0 also holds
    # nvidia1..N: that does not put it on those GPUs.
    listed_by_smi = {a.pid for a in apps}
    for key, h in on_gpu.items():
        if key not in visible and h.pid not in listed_by_smi:
            visible[key] = _gpu_process(h.pid, key[1], None, False, True, procs.get(h.pid),
                                        fallback_user=h.user)  # fmt: skip
    listed = {pid for pid, _ in visible} | {h.pid for h in holders if h.path in other_gpus}
    ctl_only = tuple(
        procs[pid] for pid in sorted(ctl_pids - listed) if pid in procs
    )  # a ctl holder that vanished is gone: nothing to show
    rule = protection or Protection()
    processes = tuple(sorted((replace(p, system=is_protected(p, rule)) for p in visible.values()),
                             key=lambda p: (p.gpu_index, p.pid)))  # fmt: skip
    hidepid, uid = s.view()
    notes += _partial_view(node, unseen, hidepid, uid)
    return NodeSnapshot(node=node.name, taken_at=taken_at, gpus=tuple(gpus),
                        processes=processes, ctl_only=ctl_only, notes=notes,
                        lost=lost, unseen=unseen, hidepid=hidepid)  # fmt: skip


def _partial_view(
    node: NodeConfig, unseen: int, hidepid: str | None, uid: int | None
) -> tuple[str, ...]:
    """Say what this probe could not see: other users' open files, hidden /proc entries."""
    notes: tuple[str, ...] = ()
    if uid not in (None, 0) and not node.sudo:  # fuser skips what it may not look into, silently
        notes += (
            f"partial view: gpubot reads this node as uid {uid}, without sudo: fuser cannot see "
            "other users' open files, so a holder of a GPU's device file may be missed",
        )
    elif unseen:
        notes += (
            f"partial view: fuser could not look into {unseen} other process(es): a holder of a "
            "GPU's device file may be missed",
        )
    if hidepid:
        notes += (
            f"partial view: /proc is mounted hidepid={hidepid}: other users' processes are "
            "hidden from gpubot, and nvidia-smi's may show as gone",
        )
    return notes


def _stuck(node: str, body: str) -> SmiFailed:
    """Say that nvidia-smi hangs in the kernel (the probe started no other); raise ParseError."""
    rows = [line.split(" ") for line in body.split("\n") if line]
    if not rows or any(len(r) != 3 or not _NUM.fullmatch(r[0]) or not _NUM.fullmatch(r[2])
                       or len(r[1]) != 1 for r in rows):  # fmt: skip
        raise ParseError("probe output (stuck section)", body[:200])
    pid, state, age = rows[0]
    more = f" (and {len(rows) - 1} more)" if len(rows) > 1 else ""
    return SmiFailed(
        node,
        f"driver hung: nvidia-smi pid {pid} stuck for {age}s (state {state}){more}; no new query "
        "started: the node needs a GPU reset or a reboot",
    )


def _with_minors(gpus: Sequence[GpuInfo], by_bus: dict[str, int | None]) -> tuple[GpuInfo, ...]:
    """Give each GPU its device minor: NVML's where it said, else the driver's for its bus id."""
    out = []
    for g in gpus:
        minor = g.minor
        if minor is None and g.bus_id is not None:
            minor = by_bus.get(normal_bus_id(g.bus_id) or "")
        out.append(replace(g, minor=minor))
    minors = [g.minor for g in out if g.minor is not None]
    if len(set(minors)) != len(minors):
        raise ParseError("device minors (two GPUs on one device file)", str(sorted(minors)))
    return tuple(out)


def _gpu_process(
    pid: int,
    gpu: int,
    mem: int | None,
    visible: bool,
    holds: bool,
    info: ProcInfo | None,
    fallback_user: str | None = None,
) -> GpuProcess:
    return GpuProcess(
        pid=pid,
        gpu_index=gpu,
        used_memory_mib=mem,
        process_name=info.comm if info else "?",
        visible_to_nvidia_smi=visible,
        holds_device_file=holds,
        user=info.user if info else fallback_user,
        ppid=info.ppid if info else None,
        state=info.state if info else None,
        start_ticks=info.start_ticks if info else None,
        elapsed_s=info.elapsed_s if info else None,
        command=info.command if info else None,
        wchan=info.wchan if info else None,
        cgroup=info.cgroup if info else None,
        workload=info.workload if info else None,
        uid=info.uid if info else None,
        real_uid=info.real_uid if info else None,
        exe=info.exe if info else None,
        argv0=info.argv0 if info else None,
    )


@dataclass
class _Sections:
    """The sections of one script's output, checked against the script's grammar."""

    what: str
    items: list[tuple[str, list[str], str]]
    node: str = "?"

    @property
    def kinds(self) -> list[str]:
        return [k for k, _, _ in self.items]

    @classmethod
    def parse(
        cls,
        text: str,
        grammar: re.Pattern[str],
        what: str,
        *,
        result: CommandResult | None = None,
        node: str = "?",
    ) -> _Sections:
        text = "\n" + text
        matches = list(_MARKER.finditer(text))
        if not matches:
            if result is not None and result.exit_status != 0:
                why = first_meaningful_line(result.stderr) or first_meaningful_line(result.stdout)
                raise ProbeError(node, f"probe failed (exit {result.exit_status}): {why}")
            raise ParseError(f"{what} (no section marker)", first_meaningful_line(text))
        if text[: matches[0].start()].strip():
            raise ParseError(f"{what} (text before the first section)", text[:80].strip())
        items: list[tuple[str, list[str], str]] = []
        for m, nxt in zip(matches, [*matches[1:], None], strict=True):
            words = m[1].split(" ")
            body = text[m.end() : nxt.start() if nxt else len(text)]
            items.append((words[0], words[1:], body))
        kinds = " ".join(k for k, _, _ in items)
        if not grammar.fullmatch(kinds):
            if items[-1][0] != "end":
                raise ParseError(f"{what} (cut short)", first_meaningful_line(text[-300:]))
            raise ParseError(f"{what} (sections out of order or repeated)", kinds[:200])
        if items[-1][2].strip():
            raise ParseError(f"{what} (text after the end)", items[-1][2].strip()[:80])
        return cls(what=what, items=items, node=node)

    def get(self, kind: str) -> tuple[list[str], str] | None:
        return next(((a, b) for k, a, b in self.items if k == kind), None)

    def args(self, kind: str, n: int) -> list[str]:
        found = self.get(kind)
        if found is None or len(found[0]) != n or found[1].strip():
            raise ParseError(f"{self.what} ({kind} section)", " ".join(found[0]) if found else "")
        return found[0]

    def status(self, kind: str) -> tuple[int, str]:
        found = self.get(kind)
        if found is None:
            raise ParseError(f"{self.what} (no {kind} section)", "")
        args, body = found
        if len(args) != 1 or not _NUM.fullmatch(args[0]):
            raise ParseError(f"{self.what} ({kind} status)", " ".join(args))
        return int(args[0]), body

    def smi_answer(self, kind: str) -> tuple[int, str, str]:
        """Return nvidia-smi's exit status, standard output and standard error for ``kind``."""
        status, body = self.status(kind)
        err = self.get(f"{kind}-err")
        if err is None or err[0]:
            raise ParseError(f"{self.what} ({kind}-err section)", "")
        return status, body, err[1]

    def view(self) -> tuple[str | None, int | None]:
        """Return /proc's ``hidepid`` option (None when not set) and the uid the probe ran as."""
        hp, uid = self.args("view", 2)
        if hp != "-" and not re.fullmatch(r"[0-9a-z]{1,16}", hp):
            raise ParseError(f"{self.what} (view section)", hp)
        if uid != "-" and not _NUM.fullmatch(uid):
            raise ParseError(f"{self.what} (view section)", uid)
        return (None if hp in ("-", "0", "off") else hp), (None if uid == "-" else int(uid))

    def fuser(self, node: NodeConfig) -> tuple[tuple[DeviceHolder, ...], int]:
        """Return fuser's holders and how many processes it could not look into."""
        status, body = self.status("fuser")
        unseen = 0
        lines = []
        for line in body.splitlines():
            if line.startswith("~unseen "):  # the awk filter's count, last
                n = line.split(" ", 1)[1]
                if not _NUM.fullmatch(n):
                    raise ParseError(f"{self.what} (fuser unseen count)", line)
                unseen = int(n)
            else:
                lines.append(line)
        body = "\n".join(lines)
        if status == 127:
            raise ProbeError(node.name, "fuser (psmisc) not found on the node")
        for line in body.splitlines():
            if line.startswith("sudo:") or line.startswith("Sorry, user"):
                raise ProbeError(node.name, f"sudo -n fuser refused: {line.strip()[:200]}")
        if status not in (0, 1):
            why = first_meaningful_line(body)
            raise ProbeError(node.name, f"fuser failed (exit {status}): {why}")
        return parse_fuser(body), unseen

    def minors(self) -> dict[str, int | None]:
        """Return each GPU's device minor by bus id (``0000:18:00.0``) from the driver's files."""
        found = self.get("minors")
        if found is None or found[0]:
            raise ParseError(f"{self.what} (minors section)", "")
        out: dict[str, int | None] = {}
        for line in found[1].split("\n"):
            if not line:
                continue
            words = line.split(" ")
            if len(words) != 2 or not _BUS_DIR.fullmatch(words[0]) or words[0] in out:
                raise ParseError(f"{self.what} (device minor line)", line[:200])
            if not (_NUM.fullmatch(words[1]) or words[1] == "-"):
                raise ParseError(f"{self.what} (device minor line)", line[:200])
            out[words[0]] = int(words[1]) if words[1] != "-" else None
        return out

    def procs(self, pids: Sequence[int]) -> dict[int, ProcInfo]:
        found = self.get("procs")
        if found is None or found[0]:
            raise ParseError(f"{self.what} (procs section)", "")
        return parse_proc_lines(found[1], pids, self.what)


def parse_proc_lines(
    body: str, pids: Sequence[int], what: str = "process listing"
) -> dict[int, ProcInfo]:
    """Parse the ``procs`` section: ``c`` once; one ``p`` or ``g`` line per PID asked, in order;
    one ``u`` line per uid seen."""
    lines = [ln for ln in body.split("\n") if ln]
    if not lines or not lines[0].startswith("c "):
        raise ParseError(f"{what} (no clock line)", lines[0] if lines else "")
    clock = lines[0].split(" ")
    if len(clock) != 3:
        raise ParseError(f"{what} (clock line)", lines[0])
    ticks = int(clock[1]) if _NUM.fullmatch(clock[1]) and int(clock[1]) > 0 else None
    uptime = _float_or_none(clock[2]) if clock[2] != "-" else None
    rows: dict[int, list[str]] = {}
    seen: list[int] = []
    names: dict[int, str | None] = {}
    for line in lines[1:]:
        f = line.split(" ")
        if f[0] in ("p", "g") and not names:
            if len(f) != (12 if f[0] == "p" else 2) or not _NUM.fullmatch(f[1]):
                raise ParseError(f"{what} (process line)", line[:200])
            pid = int(f[1])
            if pid in seen:
                raise ParseError(f"{what} (pid {pid} twice)", line[:200])
            seen.append(pid)
            if f[0] == "p":
                rows[pid] = f
        elif f[0] == "u" and len(f) == 3 and _NUM.fullmatch(f[1]) and int(f[1]) not in names:
            names[int(f[1])] = None if f[2] == "!" else _unescape(f[2], what)
        else:
            raise ParseError(f"{what} (unexpected line)", line[:200])
    asked = list(dict.fromkeys(pids))
    if seen != asked:
        raise ParseError(f"{what} (pids not as asked)", f"{seen[:20]} for {asked[:20]}")
    uids = {int(f[6]) for f in rows.values() if _NUM.fullmatch(f[6])}
    if uids != set(names):
        raise ParseError(f"{what} (owner names)", " ".join(map(str, sorted(uids)))[:200])
    out: dict[int, ProcInfo] = {}
    for pid, f in rows.items():
        out[pid] = _proc_info(pid, f, names, ticks, uptime, what)
    return out


def _proc_info(
    pid: int,
    f: list[str],
    names: dict[int, str | None],
    ticks: int | None,
    uptime: float | None,
    what: str,
) -> ProcInfo:
    """Build one ProcInfo from ``p PID STATE PPID START RUID EUID =COMM =CMD =EXE|! =CG =WCHAN``."""
    _, _, state, ppid, start, ruid, euid, comm, cmd, exe, cgroup, wchan = f
    if len(state) != 1 or not state.isalpha() or not all(_NUM.fullmatch(x) for x in (ppid, start)):
        raise ParseError(f"{what} (process line)", " ".join(f)[:200])
    uid = int(euid) if _NUM.fullmatch(euid) else None
    real = int(ruid) if _NUM.fullmatch(ruid) else None
    if uid is None:
        raise ParseError(f"{what} (process line: no uid)", " ".join(f)[:200])
    elapsed = None
    if ticks and uptime is not None:
        elapsed = max(0, int(uptime - int(start) / ticks))
    name = _unescape(comm, what)
    argv = _unescape(cmd, what).rstrip("\0").split("\0")
    command = printable(" ".join(a for a in argv)).strip()
    w = _unescape(wchan, what).strip()
    cg = _unescape(cgroup, what).strip()
    return ProcInfo(
        pid=pid,
        ppid=int(ppid),
        user=names.get(uid) or str(uid),
        state=state,
        start_ticks=int(start),
        elapsed_s=elapsed,
        command=command or f"[{printable(name)}]",
        wchan=None if w in ("", "0") else printable(w),
        cgroup=cg or None,
        workload=parse_cgroup(cg),
        uid=uid,
        real_uid=real,
        exe=None if exe == "!" else _unescape(exe, what),
        comm=printable(name),
        argv0=argv[0],
    )


def _unescape(field: str, what: str) -> str:
    """Decode one escaped field (``=`` then printable ASCII and ``\\ooo``); raise ParseError."""
    if not _ESCAPED.fullmatch(field):
        raise ParseError(f"{what} (escaped field)", field[:200])
    raw = _OCTAL.sub(lambda m: chr(int(m[1], 8)), field[1:])
    return raw.encode("latin-1").decode("utf-8", errors="replace")


def printable(text: str) -> str:
    """Return ``text`` with every non-printable character (newline, tab, bidi ...) as ``\\xNN``."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


def _float_or_none(s: str | None) -> float | None:
    try:
        return float(s) if s else None
    except ValueError:
        return None


def _nonneg(i: int) -> int:
    if isinstance(i, bool) or not isinstance(i, int) or i < 0:
        raise ValueError(f"expected a non-negative integer, got {i!r}")
    return i


def _seconds(s: float) -> str:
    return f"{s:.3f}".rstrip("0").rstrip(".")


def _check_prefix(node: NodeConfig) -> None:
    if not node.dev_prefix.startswith("/"):
        raise ConfigError(f"node {node.name}: dev_prefix must be an absolute path")
