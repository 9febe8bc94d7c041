"""The node probe: ONE remote exec that gathers everything a ``NodeSnapshot`` needs.

The probe is a constant POSIX ``sh`` script (dash-compatible). Everything that varies (the nonce,
the nvidia-smi command, the device prefix, PIDs) arrives as positional arguments, so no text from a
user or from a remote output ever reaches a shell unquoted. It runs the GPU and compute-apps queries
under ``timeout`` (a hung nvidia-smi becomes exit 124 and is killed), ``fuser -v`` on exactly the
device files of the GPUs found plus ``{prefix}ctl`` and ``{prefix}-uvm`` (never a glob), then reads
``/proc`` for every PID seen.

Its output is a series of sections, each opened by a line ``<nonce> <kind> <args...>`` printed
after a newline. The nonce is random per call, so no process name or nvidia-smi output can forge a
section. A PID that vanishes mid-probe is simply absent.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

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
    apps_query_argv,
    first_meaningful_line,
    gpu_query_argv,
    parse_apps,
    parse_gpus,
    smi_error,
)
from gpubot.errors import ConfigError, ParseError, ProbeError

NONCE = re.compile(r"[0-9a-f]{16,64}")

# Prints a section marker; every marker starts on a fresh line (output may lack a final newline).
_MARK = """m() { printf '\\n%s %s\\n' "$N" "$*"; }
set -f
"""

# /proc for each PID argument: stat (comm may hold spaces, parens, newlines), owner, cmdline
# (NUL -> space), wchan, first cgroup line. Builtins where possible: this runs for every PID.
# /proc for each PID argument: stat (comm may hold spaces, parens, newlines), cmdline (NUL ->
# space), wchan, first cgroup line, then every owner in one stat(1). Builtins where possible: this
# runs for every PID. A stat line is complete when 20+ fields follow its last ")": comm (at most 15
# bytes) cannot fake that, so only a comm holding a newline costs a cat.
_PROCS = """procs() {
  up=; { read -r up _; } 2>/dev/null </proc/uptime
  m clock "$(getconf CLK_TCK 2>/dev/null)" "$up"
  seen=' ' dirs=
  for p in "$@"; do
    case $p in ''|*[!0-9]*) continue ;; esac
    case $seen in *" $p "*) continue ;; esac
    seen="$seen$p "
    s=; { read -r s; } 2>/dev/null <"/proc/$p/stat"
    [ -n "$s" ] || continue
    m stat "$p"
    IFS=' '; set -- ${s##*)}
    if [ $# -ge 20 ]; then printf '%s\\n' "$s"; else cat "/proc/$p/stat" 2>/dev/null; fi
    m cmdline "$p"; tr '\\0' ' ' 2>/dev/null <"/proc/$p/cmdline"
    w=; { read -r w; } 2>/dev/null <"/proc/$p/wchan"
    m wchan "$p"; printf '%s\\n' "$w"
    c=; { read -r c; } 2>/dev/null <"/proc/$p/cgroup"
    m cgroup "$p"; printf '%s\\n' "$c"
    dirs="$dirs /proc/$p"
  done
  m owners
  [ -z "$dirs" ] || stat -c '%n %U %u' $dirs 2>/dev/null
}
"""

# Numeric first CSV fields of each line of $1 (GPU indices, PIDs), space separated.
_FIRSTS = """firsts() {
  printf '%s\\n' "$1" | while IFS=, read -r f _; do
    case $f in ''|*[!0-9]*) ;; *) printf '%s ' "$f" ;; esac
  done
}
"""


def _smi(argv: list[str]) -> str:
    # The queries are constants; only "$smi" (and -i "$idx") vary and are quoted.
    return '"$smi" ' + " ".join(argv[1:])


_GPU_Q = _smi(gpu_query_argv("nvidia-smi"))
_APPS_Q = _smi(apps_query_argv("nvidia-smi"))

PROBE_SCRIPT = (
    _MARK
    + _PROCS
    + _FIRSTS
    + f"""N=$1 smi=$2 pre=$3 T=$4 sudo=$5 mode=$6 idx=$7
shift 7
extra=$*
exec 4>&1
PATH=$PATH:/usr/sbin:/sbin  # fuser lives in sbin on some distributions
m probe "$T" "${{idx:--}}"
need() {{ command -v "$1" >/dev/null 2>&1 || {{ m fatal "no-$1"; m end; exit 0; }}; }}
if [ "$sudo" = sudo ]; then need sudo; else need fuser; fi
if [ "$mode" = smi ]; then
  need timeout
  m gpus-err
  if [ -n "$idx" ]; then
    g=$(timeout -k 1 "$T" {_GPU_Q} -i "$idx" 2>&4)
  else
    g=$(timeout -k 1 "$T" {_GPU_Q} 2>&4)
  fi
  s=$?
  m gpus "$s"; printf '%s\\n' "$g"
  [ "$s" -eq 0 ] || {{ m end; exit 0; }}
  [ -n "$idx" ] || idx=$(firsts "$g")
  m apps-err
  a=$(timeout -k 1 "$T" {_APPS_Q} 2>&4)
  s=$?
  m apps "$s"; printf '%s\\n' "$a"
  [ "$s" -eq 0 ] || {{ m end; exit 0; }}
  extra="$extra $(firsts "$a")"
fi
set --
IFS=', '
for i in $idx; do
  case $i in ''|*[!0-9]*) continue ;; esac
  [ -e "$pre$i" ] && set -- "$@" "$pre$i"
done
IFS=' '
for f in "${{pre}}ctl" "${{pre}}-uvm"; do [ -e "$f" ] && set -- "$@" "$f"; done
if [ $# -gt 0 ]; then
  if [ "$sudo" = sudo ]; then f=$(sudo -n fuser -v "$@" 2>&1); else f=$(fuser -v "$@" 2>&1); fi
  s=$?
else
  f= s=1
fi
m fuser "$s"
# The table without permission noise goes out; the PIDs (field before ACCESS) come back.
fp=$(printf '%s\\n' "$f" | awk '
  /^Cannot stat / {{ next }}
  {{ print
    for (i = 2; i <= NF; i++)
      if ($i ~ /^[.cefFrmM][.cefFrmM][.cefFrmM][.cefFrmM][.cefFrmM]$/ && $(i-1) ~ /^[0-9]+$/)
        printf "%s ", $(i-1) > "/dev/stderr"
  }}
' 2>&1 >&4)
procs $extra $fp
m end
"""
)

PROC_SCRIPT = (
    _MARK
    + _PROCS
    + """N=$1
shift
m procs
procs "$@"
m end
"""
)


_MISSING = {
    "no-timeout": "timeout (coreutils) not found on the node",
    "no-fuser": "fuser (psmisc) not found on the node",
    "no-sudo": "sudo not found on the node (its inventory entry says sudo = true)",
}


def new_nonce() -> str:
    """Return a fresh random section nonce."""
    return secrets.token_hex(16)


def probe_argv(
    node: NodeConfig,
    nonce: str,
    *,
    smi_timeout_s: float,
    gpu_indices: Sequence[int] | None = None,
    skip_smi: bool = False,
    pids: Sequence[int] = (),
) -> list[str]:
    """Return the argv of the one-exec probe of ``node``.

    ``skip_smi`` (the local box read through NVML) needs ``gpu_indices``; ``pids`` are extra
    processes to read from ``/proc`` (NVML's compute apps).
    """
    _check_nonce(nonce)
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
        nonce,
        node.nvidia_smi,
        node.dev_prefix,
        _seconds(smi_timeout_s),
        "sudo" if node.sudo else "-",
        "nvml" if skip_smi else "smi",
        idx,
        *(str(_nonneg(p)) for p in pids),
    ]


def proc_argv(pids: Sequence[int], *, sudo: bool, nonce: str | None = None) -> list[str]:
    """Return the argv that reads ``/proc`` for ``pids`` alone (parse with ``parse_procs``)."""
    nonce = nonce or new_nonce()
    _check_nonce(nonce)
    argv = ["sh", "-c", PROC_SCRIPT, "gpubot-procs", nonce, *(str(_nonneg(p)) for p in pids)]
    return ["sudo", "-n", *argv] if sudo else argv


def parse_procs(text: str) -> dict[int, ProcInfo]:
    """Parse the output of ``proc_argv``; a PID that vanished is absent; raise ParseError."""
    start = text.lstrip("\n")
    nonce = start.split(" ", 1)[0]
    if not NONCE.fullmatch(nonce):
        raise ParseError("process listing (no section marker)", first_meaningful_line(text))
    sections = _Sections.parse(text, nonce, "process listing")
    return sections.procs()


def fuser_argv(paths: Sequence[str], *, sudo: bool) -> list[str]:
    """Return ``fuser -v PATHS`` (+ ``sudo -n``), its stderr merged into stdout in order.

    fuser writes the PIDs to stdout and the rest of its table to stderr; only the merged stream
    (``result.stdout``) can be parsed.
    """
    if not paths:
        raise ValueError("fuser needs at least one path")
    for p in paths:
        if not p.startswith("/"):
            raise ValueError(f"fuser paths must be absolute: {p!r}")
    inner = ["sudo", "-n", "fuser", "-v", *paths] if sudo else ["fuser", "-v", *paths]
    return ["sh", "-c", 'PATH=$PATH:/usr/sbin:/sbin; exec 2>&1; exec "$@"', "gpubot-fuser", *inner]


_ACCESS = re.compile(r"[.cefFrmM]{5}")
_PATH_LINE = re.compile(r"(?P<path>\S.*?):(?:\s+(?P<rest>.*))?")
_FUSER_NOISE = ("Cannot stat ", "Specified filename ")


def parse_fuser(text: str) -> tuple[DeviceHolder, ...]:
    """Parse ``fuser -v`` output (stdout and stderr merged); raise ParseError."""
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
        if len(parts) != 4 or not parts[1].isdigit() or not _ACCESS.fullmatch(parts[2]):
            raise ParseError("fuser line", raw)
        user, pid, access, command = parts
        holders.append(DeviceHolder(path=path, pid=int(pid), user=user, access=access,
                                    command=command))  # fmt: skip
    return tuple(holders)


def parse_probe(
    node: NodeConfig,
    nonce: str,
    result: CommandResult,
    taken_at: float,
    nvml: tuple[tuple[GpuInfo, ...], tuple[ComputeApp, ...]] | None = None,
) -> NodeSnapshot:
    """Build the snapshot of ``node`` from the probe's result (and NVML's tables when given).

    Raises ``SmiMissing``/``SmiFailed`` when nvidia-smi failed, ``ProbeError`` when the probe could
    not run, ``ParseError`` on output that cannot be parsed.
    """
    _check_nonce(nonce)
    s = _Sections.parse(result.stdout, nonce, "probe output", result=result, node=node.name)
    fatal = s.first("fatal")
    if fatal is not None:
        missing = fatal[0][0] if fatal[0] else "?"
        raise ProbeError(node.name, _MISSING.get(missing, f"probe stopped: {missing}"))
    timeout_s = _float_or_none(s.probe_arg(0))
    if nvml is not None:
        gpus, apps = nvml
    else:
        gpus = parse_gpus(s.smi_output("gpus", node.name, timeout_s))
        apps = parse_apps(s.smi_output("apps", node.name, timeout_s))
    by_uuid = {g.uuid: g.index for g in gpus}
    holders = s.fuser(node)
    procs = s.procs()

    gpu_paths = {node.device(g.index): g.index for g in gpus}
    ctl_paths = {f"{node.dev_prefix}ctl", f"{node.dev_prefix}-uvm"}
    on_gpu: dict[tuple[int, int], DeviceHolder] = {}
    ctl_pids: set[int] = set()
    for h in holders:
        if h.path in gpu_paths:
            on_gpu.setdefault((h.pid, gpu_paths[h.path]), h)
        elif h.path in ctl_paths:
            ctl_pids.add(h.pid)
        else:
            raise ParseError("fuser line (a file the probe did not ask about)", h.path)

    visible: dict[tuple[int, int], GpuProcess] = {}
    for app in apps:
        if app.gpu_uuid not in by_uuid:
            if nvml is None and s.probe_arg(1) == "-":  # every GPU was asked for
                raise ParseError("compute app on a GPU nvidia-smi did not list", app.gpu_uuid)
            continue
        key = (app.pid, by_uuid[app.gpu_uuid])
        prev = visible.get(key)
        mem = app.used_memory_mib
        if prev is not None:  # one process, several contexts on one GPU: add them up
            mem = (
                None if mem is None or prev.used_memory_mib is None else mem + prev.used_memory_mib
            )
        visible[key] = _gpu_process(app.pid, key[1], mem, app.process_name, True,
                                    key in on_gpu, procs.get(app.pid))  # fmt: skip
    # A hidden holder is a process nvidia-smi lists on NO GPU (another PID namespace, a leak).
    # CUDA opens every visible GPU's device file, so a job nvidia-smi lists on GPU 0 also holds
    # nvidia1..N: that does not put it on those GPUs.
    listed_by_smi = {a.pid for a in apps}
    for key, h in on_gpu.items():
        if key not in visible and h.pid not in listed_by_smi:
            name = s.comms.get(h.pid, h.command)  # fuser misreads a comm holding ")"
            visible[key] = _gpu_process(h.pid, key[1], None, name, False, True,
                                        procs.get(h.pid), fallback_user=h.user)  # fmt: skip
    listed = {pid for pid, _ in visible}
    ctl_only = tuple(
        procs[pid] for pid in sorted(ctl_pids - listed) if pid in procs
    )  # a ctl holder that vanished is gone: nothing to show
    processes = tuple(sorted(visible.values(), key=lambda p: (p.gpu_index, p.pid)))
    return NodeSnapshot(node=node.name, taken_at=taken_at, gpus=tuple(gpus),
                        processes=processes, ctl_only=ctl_only)  # fmt: skip


def _gpu_process(
    pid: int,
    gpu: int,
    mem: int | None,
    name: str,
    visible: bool,
    holds: bool,
    info: ProcInfo | None,
    fallback_user: str | None = None,
) -> GpuProcess:
    return GpuProcess(
        pid=pid,
        gpu_index=gpu,
        used_memory_mib=mem,
        process_name=name,
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
    )


@dataclass
class _Sections:
    """The sections of one probe's output, in order."""

    what: str
    items: list[tuple[str, list[str], str]] = field(default_factory=list)
    node: str = "?"
    stderr: str = ""
    comms: dict[int, str] = field(default_factory=dict)  # comm of each PID read, from stat

    @classmethod
    def parse(
        cls,
        text: str,
        nonce: str,
        what: str,
        *,
        result: CommandResult | None = None,
        node: str = "?",
    ) -> _Sections:
        marker = re.compile("\n" + re.escape(nonce) + " ([^\n]*)\n")
        text = "\n" + text
        matches = list(marker.finditer(text))
        out = cls(what=what, node=node, stderr=result.stderr if result else "")
        if not matches:
            if result is not None and result.exit_status != 0:
                why = first_meaningful_line(result.stderr) or first_meaningful_line(result.stdout)
                raise ProbeError(node, f"probe failed (exit {result.exit_status}): {why}")
            raise ParseError(f"{what} (no section marker)", first_meaningful_line(text))
        for m, nxt in zip(matches, [*matches[1:], None], strict=True):
            words = m[1].split(" ")
            body = text[m.end() : nxt.start() if nxt else len(text)]
            out.items.append((words[0], words[1:], body))
        if out.items[-1][0] != "end":
            raise ParseError(f"{what} (cut short)", first_meaningful_line(text[-300:]))
        return out

    def first(self, kind: str) -> tuple[list[str], str] | None:
        return next(((a, b) for k, a, b in self.items if k == kind), None)

    def probe_arg(self, i: int) -> str | None:
        found = self.first("probe")
        return found[0][i] if found and len(found[0]) > i else None

    def smi_output(self, kind: str, node: str, timeout_s: float | None) -> str:
        found = self.first(kind)
        if found is None:
            raise ParseError(f"{self.what} (no {kind} section)", "")
        args, body = found
        status = _int(args[0] if args else "", f"{self.what} ({kind} status)")
        if status != 0:
            err = self.first(f"{kind}-err")
            text = (err[1] if err else "") + "\n" + body
            error = smi_error(node, status, text, timeout_s=timeout_s)
            assert error is not None
            raise error
        return body

    def fuser(self, node: NodeConfig) -> tuple[DeviceHolder, ...]:
        found = self.first("fuser")
        if found is None:
            raise ParseError(f"{self.what} (no fuser section)", "")
        args, body = found
        status = _int(args[0] if args else "", f"{self.what} (fuser status)")
        if status == 127:
            raise ProbeError(node.name, "fuser (psmisc) not found on the node")
        for line in body.splitlines():
            if line.startswith("sudo:"):
                raise ProbeError(node.name, f"sudo -n fuser refused: {line.strip()}")
        if status not in (0, 1):
            why = first_meaningful_line(body)
            raise ProbeError(node.name, f"fuser failed (exit {status}): {why}")
        return parse_fuser(body)

    def procs(self) -> dict[int, ProcInfo]:
        clock = self.first("clock")
        ticks: int | None = None
        uptime: float | None = None
        if clock is not None and len(clock[0]) == 2:
            ticks = int(clock[0][0]) if clock[0][0].isdigit() and clock[0][0] != "0" else None
            uptime = _float_or_none(clock[0][1])
        fields: dict[int, dict[str, str]] = {}
        for kind, args, body in self.items:
            if kind in ("stat", "cmdline", "wchan", "cgroup"):
                pid = _int(args[0] if args else "", f"{self.what} ({kind} pid)")
                fields.setdefault(pid, {})[kind] = body
            elif kind == "owners":  # "/proc/PID USER UID" per line
                for line in body.splitlines():
                    words = line.split()
                    if len(words) != 3 or not words[0].startswith("/proc/"):
                        raise ParseError(f"{self.what} (owner line)", line)
                    pid = _int(words[0][len("/proc/") :], f"{self.what} (owner pid)")
                    fields.setdefault(pid, {})["owner"] = f"{words[1]} {words[2]}"
        out: dict[int, ProcInfo] = {}
        for pid, f in fields.items():
            info = _proc_info(pid, f, ticks, uptime)
            if info is not None:
                out[pid] = info
                stat = f["stat"]
                self.comms[pid] = stat[stat.find("(") + 1 : stat.rfind(")")]
        return out


def _proc_info(
    pid: int, f: Mapping[str, str], ticks: int | None, uptime: float | None
) -> ProcInfo | None:
    """Build one ProcInfo; None when the process vanished before all of it was read."""
    stat = _strip_nl(f.get("stat", ""))
    owner = _strip_nl(f.get("owner", "")).split()
    if not stat or not owner:
        return None
    # /proc/PID/stat: "pid (comm) state ppid ... starttime(22) ..."; comm may hold anything.
    lpar, rpar = stat.find("("), stat.rfind(")")
    if lpar < 0 or rpar < lpar:
        raise ParseError("/proc/PID/stat", stat)
    head, comm, rest = stat[:lpar].strip(), stat[lpar + 1 : rpar], stat[rpar + 1 :].split()
    if head != str(pid) or len(rest) < 20 or not rest[1].lstrip("-").isdigit():
        raise ParseError("/proc/PID/stat", stat)
    if not rest[19].isdigit() or len(rest[0]) != 1:
        raise ParseError("/proc/PID/stat", stat)
    state, ppid, start = rest[0], int(rest[1]), int(rest[19])  # fields 3, 4, 22
    elapsed = None
    if ticks and uptime is not None:
        elapsed = max(0, int(uptime - start / ticks))
    user = owner[0] if owner[0] != "UNKNOWN" or len(owner) < 2 else owner[1]
    cmdline = f.get("cmdline", "").replace("\n", " ").strip()
    wchan = _strip_nl(f.get("wchan", "")).strip()
    cgroup = _strip_nl(f.get("cgroup", "")).strip()
    return ProcInfo(
        pid=pid,
        ppid=ppid,
        user=user,
        state=state,
        start_ticks=start,
        elapsed_s=elapsed,
        command=cmdline or f"[{comm}]",
        wchan=None if wchan in ("", "0") else wchan,
        cgroup=cgroup or None,
    )


def _strip_nl(s: str) -> str:
    return s[:-1] if s.endswith("\n") else s


def _int(s: str, what: str) -> int:
    if not s.lstrip("-").isdigit():
        raise ParseError(what, s)
    return int(s)


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


def _check_nonce(nonce: str) -> None:
    if not NONCE.fullmatch(nonce):
        raise ValueError("nonce must be 16-64 lowercase hex digits")


def _check_prefix(node: NodeConfig) -> None:
    if not node.dev_prefix.startswith("/"):
        raise ConfigError(f"node {node.name}: dev_prefix must be an absolute path")
