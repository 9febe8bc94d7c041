"""The stand-in ``scontrol``, ``scancel`` and ``systemctl``: the registry's Slurm jobs and units.

Standalone (standard library only, relative imports only); ``runtimes`` documents the formats and
where each comes from.
"""

from __future__ import annotations

import os
import time
from typing import Any

from .runtime_registry import KILL_WAIT_S, Entry, err, live, stop


def _duration(seconds: float) -> str:
    """Format ``seconds`` as Slurm's RunTime: ``[D-]HH:MM:SS``."""
    s = max(0, int(seconds))
    days, s = divmod(s, 86400)
    text = f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{days}-{text}" if days else text


def scontrol_lines(e: Entry, allocs: list[dict[str, Any]], node: str) -> list[str]:
    """Return ``scontrol show job``'s record of one job, line by line."""
    running, _pid, _restarts, died = live(e, allocs)
    j = e["job"]
    start = e["created"]
    end = None if running else (e.get("finished") or died or time.time())
    if running:
        state, reason, code = "RUNNING", "None", "0:0"
    elif e["state"] == "cancelled":
        state, reason, code = "CANCELLED", "None", "0:15"
    else:
        state, reason, code = "FAILED", "NonZeroExitCode", "0:9"

    def local(t: float | None) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t)) if t else "Unknown"

    home = j.get("home") or f"/home/{j['user']}"
    return [
        f"JobId={j['id']} JobName={j['name']}",
        f"   UserId={j['user']}({j['uid']}) GroupId={j['group']}({j['gid']}) MCS_label=N/A",
        f"   Priority=4294901759 Nice=0 Account={j['user']} QOS=normal",
        f"   JobState={state} Reason={reason} Dependency=(null)",
        f"   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode={code}",
        f"   RunTime={_duration((end or time.time()) - start)} TimeLimit=UNLIMITED TimeMin=N/A",
        f"   SubmitTime={local(start)} EligibleTime={local(start)}",
        f"   AccrueTime={local(start)}",
        f"   StartTime={local(start)} EndTime={local(end)} Deadline=N/A",
        f"   SuspendTime=None SecsPreSuspend=0 LastSchedEval={local(start)} Scheduler=Main",
        f"   Partition=gpu AllocNode:Sid={node}:{e['pid']}",
        "   ReqNodeList=(null) ExcNodeList=(null)",
        f"   NodeList={node}",
        f"   BatchHost={node}",
        "   NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:*",
        "   TRES=cpu=1,node=1,billing=1,gres/gpu=1",
        "   Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=*",
        "   MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0",
        "   Features=(null) DelayBoot=00:00:00",
        "   OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null)",
        f"   Command={home}/{j['name']}.sh",
        f"   WorkDir={home}",
        f"   StdErr={home}/slurm-{j['id']}.out",
        "   StdIn=/dev/null",
        f"   StdOut={home}/slurm-{j['id']}.out",
        "   TresPerNode=gres/gpu:1",
    ]


def slurm(
    prog: str,
    argv: list[str],
    state_dir: str,
    entries: list[Entry],
    allocs: list[dict[str, Any]],
    node: str,
    root: bool,
) -> int:
    """``scontrol [-o] show job ID`` and ``scancel ID...`` of ``entries``; the exit code."""
    jobs = {e["id"]: e for e in entries if e["kind"] == "slurm"}
    if prog == "scontrol":
        one_line = "-o" in argv or "--oneliner" in argv
        args = [a for a in argv if a not in ("-o", "--oneliner")]
        if len(args) != 3 or args[0] != "show" or args[1] != "job":
            err("gpusim: scontrol: only 'show job ID' is simulated")
            return 1
        e = jobs.get(args[2])
        if e is None:
            err("slurm_load_jobs error: Invalid job id specified")
            return 1
        lines = scontrol_lines(e, allocs, node)
        print(" ".join(ln.strip() for ln in lines) if one_line else "\n".join(lines) + "\n")
        return 0
    if not argv or any(a.startswith("-") for a in argv):
        err("gpusim: scancel: only 'scancel JOBID...' is simulated")
        return 1
    rc = 0
    for ref in argv:
        e = jobs.get(ref)
        if e is None:
            err(f"scancel: error: Kill job error on job id {ref}: Invalid job id specified")
            rc = 1
        elif not root and e["job"]["uid"] != os.geteuid():
            err(f"scancel: error: Kill job error on job id {ref}: Access/permission denied")
            rc = 1
        else:
            stop(state_dir, e, "cancelled", KILL_WAIT_S)
    return rc


def systemctl(argv: list[str], state_dir: str, entries: list[Entry], root: bool) -> int:
    """``systemctl stop UNIT...`` of the fleet's ``gpusim-N.service`` units; the exit code."""
    if len(argv) < 2 or argv[0] != "stop":
        err("gpusim: systemctl: only 'stop UNIT...' is simulated")
        return 1
    units = {e["id"]: e for e in entries if e["kind"] == "service"}
    rc = 0
    for unit in argv[1:]:
        e = units.get(unit)
        if e is None:
            err(f"Failed to stop {unit}: Unit {unit} not loaded.")
            rc = 5
        elif not root:
            err(f"Failed to stop {unit}: Interactive authentication required.")
            rc = rc or 1
        else:
            stop(state_dir, e, "stopped", KILL_WAIT_S)
    return rc
