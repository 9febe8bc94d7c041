"""Helpers of the hostile-probe tests: the probe script with a defence textually removed (the
controls), setuid fakes of nvidia-smi, floods of control-file holders, and the probe's own
processes on a simulated node, by PID and start time."""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from gpubot.core.probe.script import PROBE_SCRIPT
from gpusim.fleet import SimNode

# The stuck check before issue 21: the effective uid alone, and "$smi" anywhere in argv.
OLD_OWN_QUERY = r"""own_query() {
  local a
  [[ -n ${U[1]} && ${U[1]} == "$me" ]] || return 1
  for a in "${A[@]}"; do [[ $a == "$smi" ]] && return 0; done
  return 1
}
"""

# The escaping before issue 21: one step (and one printf) per byte outside printable ASCII.
OLD_ESC_ALL = r"""esc_all() {
  local k s o c i n
  for k in "${!P[@]}"; do
    s=${P[k]//\\/"$E1"}; s=${s// /"$E2"}; s=${s//$'\n'/"$E3"}; s=${s//$'\t'/"$E4"}
    if [[ $s == *[!\!-~]* ]]; then
      o=
      for (( i = 0, n = ${#s}; i < n; i++ )); do
        c=${s:i:1}
        case $c in [\!-~]) o+=$c ;; *) printf -v c '\\%03o' "'$c"; o+=$c ;; esac
      done
      s=$o
    fi
    P[k]=$s
  done
}
"""

NEW_READING = '(( ctl )) || FP+=" ${F[i-1]}"'
OLD_READING = 'FP+=" ${F[i-1]}"'  # every holder's /proc read, control files' too


def _function(name: str) -> str:
    m = re.search(rf"^{name}\(\) \{{.*?^\}}\n", PROBE_SCRIPT, re.S | re.M)
    assert m is not None, f"no {name} in the probe script"
    return m[0]


def old_script(
    *, own_query: str | None = None, escaping: bool = False, reading: bool = False
) -> str:
    """Return the probe script with the named defences replaced by the code they replaced."""
    script = PROBE_SCRIPT
    swaps = []
    if own_query is not None:
        swaps.append((_function("own_query"), own_query))
    if escaping:
        swaps.append((_function("esc_all"), OLD_ESC_ALL))
    if reading:
        swaps.append((NEW_READING, OLD_READING))
    for new, old in swaps:
        assert script.count(new) == 1, new
        script = script.replace(new, old)
    return script


@contextlib.contextmanager
def setuid_folder() -> Iterator[Path]:
    """A fresh folder on a file system that honours setuid bits (not mounted nosuid)."""
    for base in (tempfile.gettempdir(), "/var/tmp", "/root"):
        if os.path.isdir(base) and not os.statvfs(base).f_flag & os.ST_NOSUID:
            break
    else:
        raise AssertionError("no folder here honours setuid bits: /tmp and /var/tmp are nosuid")
    folder = Path(tempfile.mkdtemp(prefix="gpubot-suid-", dir=base))
    try:
        folder.chmod(0o755)
        yield folder
    finally:
        shutil.rmtree(folder)


def fake_smi(folder: Path, owner: str, runner: str, argv: list[str]) -> subprocess.Popen[bytes]:
    """Start, as ``runner``, a setuid-``owner`` copy of ``sleep`` through a link named
    ``nvidia-smi`` (its comm), with ``argv`` (``exec -a``): waiting, as if on a terminal."""
    pw = pwd.getpwnam(owner)
    exe = folder / f"sleep-{owner}"
    shutil.copy("/bin/sleep", exe)
    os.chown(exe, pw.pw_uid, pw.pw_gid)
    exe.chmod(0o4755)
    link = folder / owner / "nvidia-smi"
    link.parent.mkdir(mode=0o755)
    link.symlink_to(exe)
    return subprocess.Popen(argv, executable=link, user=runner, stdin=subprocess.DEVNULL)


def nonascii_argv0(n: int = 4096) -> bytes:
    """``n`` bytes of UTF-8 text (Latin, Greek, Cyrillic, CJK): almost every byte is not ASCII."""
    text = "".join(
        chr(c) for c in [*range(0xC0, 0x250), *range(0x391, 0x3C9), *range(0x4E00, 0x4F00)]
    )
    raw = (text * (n // len(text.encode()) + 1)).encode()[:n]
    return raw.decode("utf-8", "ignore").encode()


class Holders:
    """``count`` processes of ``user`` holding only ``{prefix}ctl`` and ``{prefix}-uvm``."""

    def __init__(self, prefix: str, user: str, count: int) -> None:
        self.prefix, self.user, self.count = prefix, user, count
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def __enter__(self) -> Holders:
        fds = [os.open(f"{self.prefix}{f}", os.O_RDWR) for f in ("ctl", "-uvm")]
        argv0 = nonascii_argv0()
        try:
            t = time.monotonic()
            for _ in range(self.count):
                self.procs.append(
                    subprocess.Popen(
                        [argv0, "600"],
                        executable="/bin/sleep",
                        user=self.user,
                        pass_fds=fds,
                        stdin=subprocess.DEVNULL,
                    )
                )
            self.spawn_s = time.monotonic() - t
        except BaseException:
            self.__exit__(None, None, None)
            raise
        finally:
            for fd in fds:
                os.close(fd)
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()


def probe_processes(node: SimNode) -> list[tuple[int, int]]:
    """Return ``(pid, start ticks)`` of the processes a probe of ``node`` runs now: its bash and
    the query subshells (``gpubot-probe`` with the node's nvidia-smi as $1) and nvidia-smi."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            stat = (d / "stat").read_text()
        except OSError:
            continue
        smi = node.nvidia_smi.encode()
        ours = argv[3:5] == [b"gpubot-probe", smi] or smi in argv[:3]
        fields = stat.rsplit(")", 1)[1].split()
        if ours and fields[0] not in ("Z", "X"):
            out.append((int(d.name), int(fields[19])))
    return sorted(out)
