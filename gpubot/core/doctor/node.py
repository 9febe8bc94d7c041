"""What ``gpubot doctor`` asks a node, in one exec, and what it makes of the answer.

The script is POSIX ``sh``, not bash: an old or missing bash is one of the things it reports.
What varies arrives as positional arguments, never in the script's text; every program runs
under ``timeout`` where the node has it. Sections are ``@doctor KIND ARGS`` lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpubot.core.doctor.checks import Check, bash_check, failed, passed, verdict
from gpubot.core.doctor.sudo import SudoNeeds, sudo_check
from gpubot.core.enrich import enrich_argv
from gpubot.core.health.kernlog import KernelRead
from gpubot.core.models import NodeConfig
from gpubot.core.nodelog import LOGGER_SH, TAG, NodeLog, find_marker
from gpubot.core.probe.nvsmi import gpu_query_argv, normal_bus_id, parse_gpus
from gpubot.core.runtimes import LOOKUPS
from gpubot.errors import ParseError

MARK = "@doctor"
DOCTOR_SCRIPT = (
    LOGGER_SH
    + r"""smi=$1 pre=$2 drv=$3 su=$4 T=$5 lg=$6
m() { printf '\n@doctor %s\n' "$*"; }
LC_ALL=C; export LC_ALL
PATH=$PATH:/usr/sbin:/sbin  # fuser lives in sbin on some distributions (as the probe)
nl='
'
lim() { if command -v timeout >/dev/null 2>&1; then timeout -k 1 "$T" "$@"; else "$@"; fi; }
m uid "$(id -u 2>/dev/null || echo -)"
if command -v bash >/dev/null 2>&1; then
  v=$(lim bash --version 2>&1); m bash; printf '%s\n' "${v%%"$nl"*}"
else m no-bash; fi
m fuser "$(command -v fuser 2>/dev/null || echo -)"
m smi-path "$(command -v "$smi" 2>/dev/null || echo -)"
shift 6
m smi; lim "$@" 2>&1; m smi-exit "$?"
m dev
for f in "$pre"[0-9]*; do [ -e "$f" ] && printf '%s\n' "${f#"$pre"}"; done
m minors
for d in "$drv"/gpus/*; do
  [ -r "$d/information" ] || continue
  while IFS= read -r l; do
    case $l in "Device Minor:"*) printf '%s %s\n' "${d##*/}" "${l#*:}" ;; esac
  done <"$d/information"
done
if [ "$su" = sudo ]; then
  if command -v sudo >/dev/null 2>&1; then m sudo; lim sudo -n -l 2>&1; m sudo-exit "$?"
  else m no-sudo; fi
fi
m logger
gpubot_log "$lg"
m mounts
while read -r _ mnt fs opts _; do
  [ "$mnt" = /proc ] && [ "$fs" = proc ] && printf '%s\n' "$opts"
done </proc/mounts 2>/dev/null
m end
"""
)


# The line the doctor writes with ``logger`` (its own words only): that the node logs it is what
# shows gpubot's actions there will be attributed in its journal (``journalctl -t gpubot``).
LOGGER_TEST = "doctor: checking that gpubot's actions on this node reach its log"


def doctor_argv(node: NodeConfig, *, timeout_s: float) -> list[str]:
    """Return the argv of the node's doctor script (each program in it limited to ``timeout_s``)."""
    limit = f"{max(1.0, timeout_s):.0f}"
    return [
        "sh",
        "-c",
        DOCTOR_SCRIPT,
        "gpubot-doctor",
        node.nvidia_smi,
        node.dev_prefix,
        node.driver_dir,
        "sudo" if node.sudo else "-",
        limit,
        LOGGER_TEST,
        *gpu_query_argv(node.nvidia_smi),
    ]


@dataclass(frozen=True)
class NodeFacts:
    """A node's answer to the doctor script; None where the script did not say."""

    complete: bool = False  # the script reached its end marker
    uid: int | None = None
    bash: str | None = None  # ``bash --version``'s first line; None: no bash
    fuser: str | None = None  # its path; None: not found
    smi_path: str | None = None
    smi_output: str = ""
    smi_exit: int | None = None
    devices: tuple[str, ...] = ()  # the suffixes of PREFIX[0-9]* that exist
    minors: dict[str, int] = field(default_factory=dict)  # driver bus id -> device minor
    sudo: str | None = None  # ``sudo -n -l``'s output; None: not asked or not installed
    sudo_installed: bool = True
    sudo_exit: int | None = None
    proc_options: str | None = None  # /proc's mount options
    logger: NodeLog | None = None  # what logger did with the test line; None: not asked


def parse_facts(stdout: str) -> NodeFacts:
    sections: dict[str, list[str]] = {}
    args: dict[str, str] = {}
    current = ""
    for line in stdout.splitlines():
        if line.startswith(MARK + " "):
            kind, _, rest = line[len(MARK) + 1 :].partition(" ")
            current = kind
            sections.setdefault(kind, [])
            args[kind] = rest.strip()
        elif current:
            sections[current].append(line)

    def body(kind: str) -> str:
        return "\n".join(sections.get(kind, [])).strip("\n")

    def path(kind: str) -> str | None:
        value = args.get(kind, "-")
        return None if value in ("-", "") else value

    minors: dict[str, int] = {}
    for ln in sections.get("minors", []):
        bus, _, minor = ln.partition(" ")
        if minor.strip().isdigit():
            minors[bus.lower()] = int(minor.strip())
    return NodeFacts(
        complete="end" in sections,
        uid=_int(args.get("uid")),
        bash=body("bash") if "bash" in sections else None,
        fuser=path("fuser"),
        smi_path=path("smi-path"),
        smi_output=body("smi"),
        smi_exit=_int(args.get("smi-exit")),
        devices=tuple(ln.strip() for ln in sections.get("dev", []) if ln.strip()),
        minors=minors,
        sudo=body("sudo") if "sudo" in sections else None,
        sudo_installed="no-sudo" not in sections,
        sudo_exit=_int(args.get("sudo-exit")),
        # The last mount of /proc is the one in effect (a namespace's over the host's).
        proc_options=body("mounts").splitlines()[-1] if body("mounts") else None,
        logger=find_marker(body("logger"), LOGGER_TEST) if "logger" in sections else None,
    )


def _int(value: str | None) -> int | None:
    return int(value) if value is not None and value.lstrip("-").isdigit() else None


def node_checks(node: NodeConfig, facts: NodeFacts, needs: SudoNeeds | None = None) -> list[Check]:
    """Turn a node's facts into its checks (``needs``: what the settings use of sudo)."""
    area = node.name
    if not facts.complete:
        return [
            failed(
                area,
                "doctor script",
                "the node's answer was cut short",
                f"check that sh, id and coreutils work on {area}, then run gpubot doctor again",
            )
        ]
    no_fuser = None if facts.fuser else "not found (PATH, /usr/sbin, /sbin)"
    checks = [
        bash_check(area, facts.bash),
        verdict(area, "fuser", no_fuser, "install psmisc (it has fuser)", facts.fuser or ""),
        *_smi_and_devices(node, facts),
    ]
    if node.sudo:
        text = facts.sudo if facts.sudo_installed else None
        checks.append(sudo_check(area, text, facts.sudo_exit, needs or SudoNeeds(node.dev_prefix)))
    checks.append(proc_check(area, facts.uid, node.sudo, facts.proc_options))
    if facts.logger is not None:
        checks.append(logger_check(area, facts.logger))
    return checks


def logger_check(area: str, log: NodeLog) -> Check:
    """Check that the node's ``logger`` wrote the test line: else gpubot's actions there (a
    SIGKILL, a ``gpu-reset``) still run, but leave no line in the node's own log."""
    if log.ok:
        return passed(area, "node log", f"a test line written (journalctl -t {TAG})")
    said = log.said or "nothing"
    problem = f"logger exit {log.exit_status}: {said}"
    fix = f"run journald or a syslog daemon on {area}: its log does not name gpubot's actions"
    return failed(area, "node log", problem, fix)


def _smi_and_devices(node: NodeConfig, facts: NodeFacts) -> list[Check]:
    area = node.name
    if facts.smi_path is None:
        fix = f"install the NVIDIA driver, or set nvidia_smi for {area} to its path"
        return [failed(area, "nvidia-smi", f"{node.nvidia_smi!r} not found", fix)]
    if facts.smi_exit in (124, 137):
        fix = "the driver may be hung: check dmesg, then reboot the node"
        return [failed(area, "nvidia-smi", "did not answer in time", fix)]
    try:
        gpus = parse_gpus(facts.smi_output) if facts.smi_exit == 0 else None
    except ParseError:
        gpus = None
    if gpus is None:
        first = (facts.smi_output.splitlines() or ["no output"])[0][:120]
        fix = "check the driver: nvidia-smi must list the GPUs"
        return [failed(area, "nvidia-smi", f"exit {facts.smi_exit}: {first}", fix)]
    checks = [passed(area, "nvidia-smi", f"{facts.smi_path}: {len(gpus)} GPU(s)")]
    buses = [normal_bus_id(g.bus_id) if g.bus_id else None for g in gpus]
    return [*checks, device_check(node, buses, facts.minors, facts.devices)]


def device_check(
    node: NodeConfig,
    buses: Sequence[str | None],
    minors: dict[str, int],
    devices: Sequence[str],
) -> Check:
    """Check that every GPU's device file (the driver's minor) is under ``dev_prefix``."""
    area, pre = node.name, node.dev_prefix
    name = "device files"
    if buses and not devices:
        return failed(
            area,
            name,
            f"no {pre}[0-9]* on the node: a holder would look like leaked memory",
            f"set dev_prefix for {area} to the prefix of the GPUs' device files (usually "
            "/dev/nvidia)",
        )
    unknown = [b or "?" for b in buses if b is None or b not in minors]
    if unknown:
        return failed(
            area,
            "driver minors",
            f"no Device Minor in {node.driver_dir}/gpus/ for {', '.join(unknown)}",
            f"set driver_dir for {area} to the driver's folder (usually /proc/driver/nvidia)",
        )
    absent = [f"{pre}{minors[b]}" for b in buses if b is not None and str(minors[b]) not in devices]
    if absent:
        return failed(
            area,
            name,
            f"missing {', '.join(absent)}",
            f"check dev_prefix for {area} (usually /dev/nvidia) and the driver's device files",
        )
    shown = ", ".join(str(minors[b]) for b in buses if b is not None)
    return passed(area, name, f"{pre}N for the driver's minors {shown}")


def proc_check(area: str, uid: int | None, sudo: bool, options: str | None) -> Check:
    """Check what gpubot's account sees in ``/proc`` and through fuser (the probe's notes)."""
    name = "/proc view"
    said = [opt for opt in (options or "").split(",") if opt.startswith("hidepid=")]
    hidepid = said[-1].partition("=")[2] if said else None  # the last one given wins
    if hidepid not in (None, "0", "off") and uid != 0:
        return failed(
            area,
            name,
            f"/proc is mounted hidepid={hidepid}: other users' processes are hidden",
            "add gpubot's account to /proc's gid= group, or remount /proc without hidepid",
        )
    if uid not in (None, 0) and not sudo:
        return failed(
            area,
            name,
            f"partial view: uid {uid} without sudo: fuser cannot see other users' processes",
            f"set sudo = true for {area} and install the README's sudoers rule",
        )
    return passed(area, name, "full view" + (" (root)" if uid == 0 else " (sudo)"))


# A lookup of an id that exists nowhere: the runtime answers "no such …" at once when it works.
_NOBODY = ("0" * 64, "1", "gpubot-doctor-none.service", "gpubot-doctor-none")
_REFUSALS = ("a password is required", "cannot connect", "permission denied", "is the docker")


def runtime_argv(runtime: str, *, timeout_s: float, sudo: bool) -> list[str]:
    """Return the lookup gpubot runs for ``runtime``, for an id no workload has."""
    lookup = LOOKUPS[runtime]
    nobody = next((i for i in _NOBODY if lookup.ids.fullmatch(i)), None)
    if nobody is None:
        raise ValueError(f"{runtime}: no id to ask about")
    return enrich_argv(runtime, [nobody], timeout_s=timeout_s, sudo=sudo)


def runtime_check(area: str, runtime: str, exit_status: int, output: str) -> Check:
    """Check that ``runtime``'s lookup answered (any answer but a hang, a refusal, no program)."""
    name = f"runtime {runtime}"
    first = next((ln.strip() for ln in output.splitlines() if ln.strip()), "")[:160]
    if exit_status in (124, 137):
        return failed(
            area,
            name,
            "its lookup did not answer in time (hangs)",
            f"check the {runtime} daemon on {area}, or raise [attribution] lookup_timeout_s",
        )
    if exit_status in (126, 127):
        return failed(
            area,
            name,
            f"not installed ({first or f'exit {exit_status}'})",
            f"install {runtime} on {area}, or remove it from the node's runtimes",
        )
    if any(r in first.lower() for r in _REFUSALS):
        return failed(
            area, name, f"refused: {first}", f"check {runtime}'s daemon and gpubot's access to it"
        )
    return passed(area, name, "answers")


KERNLOG = "kernel log (Xid)"  # the check's name


def kernlog_check(area: str, user: str | None, read: KernelRead) -> Check:
    """Return the check of one node's kernel-log read (``[sweep] kernel_log = true``): which
    source the account may read, or the one line that gives it one (never sudo)."""
    if read.source == "journal":
        return passed(area, KERNLOG, "journalctl -k is readable")
    if read.source == "dmesg":
        return passed(area, KERNLOG, "dmesg is readable (no journal for this account)")
    who = user or "the SSH account"
    why = "; ".join(read.denied) or "neither journalctl -k nor dmesg answered"
    fix = (
        f"usermod -aG systemd-journal {who} on the node (or sysctl kernel.dmesg_restrict=0), "
        "or set [sweep] kernel_log = false"
    )
    return failed(area, KERNLOG, why, fix)
