"""Run every benchmark and print one report: ``python -m benchmarks.run``.

::

    python -m benchmarks.run --nodes 8,32,64 --repeat 5      # the full run (a few minutes)
    python -m benchmarks.run --smoke                         # N=4, 1 repeat: keeps it working

Parts (``--only``): ``status`` (fleet status, scaling, sweep cost, 1,000-node extrapolation),
``reset`` (reset latency split), ``slack`` (acknowledgement under a burst), and, only when asked,
``probe`` (one node's probe with 200 hostile holders, before and after its guards) and ``scale`` (a
running bot over ``--scale-nodes`` asyncssh nodes, 512 by default). The report is Markdown on
stdout (``--out FILE`` also writes it, ``--json FILE`` the raw figures); progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import execs, extrapolate, fleet_status, probe_cost, reset_latency, scale, slack_ack
from benchmarks.benchuser import bench_user, fleet_as
from benchmarks.common import FleetYields, Series, fmt_ms, fmt_s, machine, sshd_listeners, table
from gpusim.fleet import SimFleet

TARGETS = {
    "cold_vs_asyncssh_cold": 1.25,  # cold wall / a minimal asyncssh script's, at each COLD_SIZES
    "cold_vs_pssh": 1.0,  # cold wall / parallel-ssh wall at the largest N: at most
    "seq_vs_cold": 5.0,  # sequential loop wall / cold wall: at least
    "warm_vs_floor": 1.25,  # warm wall / asyncssh floor wall: at most
    "ack_p99_s": 0.300,
}
COLD_SIZES = (32, 64)  # where the cold targets apply (each size is reported)


def log(msg: str) -> None:
    """Print progress on stderr."""
    print(msg, file=sys.stderr, flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse the command line."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n")[0])
    p.add_argument("--nodes", default="8,32,64", help="fleet sizes, comma separated (max 64)")
    p.add_argument("--repeat", type=int, default=5, help="runs of each method per size")
    p.add_argument(
        "--slow-repeat",
        type=int,
        default=3,
        help="at most this many runs of the slow methods (ssh-seq, ansible)",
    )
    p.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    p.add_argument("--procs", type=int, default=2, help="GPU processes per node (GPUs 0..)")
    p.add_argument("--methods", default=",".join(fleet_status.METHODS))
    p.add_argument("--only", default="status,reset,slack", help="parts to run")
    p.add_argument("--reset-repeat", type=int, default=5)
    p.add_argument("--grace", type=float, default=2.0, help="reset grace period (s)")
    p.add_argument("--release-delay", type=float, default=1.0, help="sim release delay (s)")
    p.add_argument("--slack-requests", type=int, default=50)
    p.add_argument(
        "--slack-wait",
        type=float,
        default=120.0,
        help="how long to wait for the burst's answers (s)",
    )
    p.add_argument(
        "--experiments",
        default="",
        help="Slack burst: also with these patches (benchmarks/experiments.py; '' none)",
    )
    p.add_argument(
        "--scale-nodes",
        type=int,
        default=scale.DEFAULT_NODES,
        help="nodes of the 'scale' part (asyncssh servers; not in the default --only)",
    )
    p.add_argument(
        "--scale-every",
        type=int,
        default=8,
        help="the 'scale' part puts --procs GPU processes on every this-many-th node",
    )
    p.add_argument("--smoke", action="store_true", help="N=4, 1 repeat, short delays")
    p.add_argument("--out", type=Path, help="also write the Markdown report here")
    p.add_argument("--json", type=Path, help="write the raw figures here")
    p.add_argument("--workdir", type=Path, help="where fleets live (default: a temp dir)")
    a = p.parse_args(argv)
    if a.smoke:
        a.nodes, a.repeat, a.slow_repeat, a.procs = "4", 1, 1, 1
        a.reset_repeat, a.grace, a.release_delay = 1, 0.5, 0.3
        a.slack_requests, a.slack_wait, a.experiments = 10, 30.0, ""
        a.scale_nodes = min(a.scale_nodes, scale.SMOKE_NODES)
    a.sizes = sorted({int(x) for x in a.nodes.split(",") if x.strip()})
    a.parts = {x.strip() for x in a.only.split(",") if x.strip()}
    a.method_list = [m.strip() for m in a.methods.split(",") if m.strip()]
    unknown = [
        m
        for m in a.method_list
        if m not in fleet_status.METHODS and not m.startswith("gpubot-warm:")
    ]
    if a.scale_nodes < 1 or a.scale_every < 1:
        p.error("--scale-nodes and --scale-every must be at least 1")
    if unknown or not a.sizes or any(not 1 <= n <= 64 for n in a.sizes) or a.repeat < 1:
        p.error(f"bad --nodes/--repeat/--methods ({unknown or a.nodes})")
    return a


# ---- the parts -------------------------------------------------------------------------------


def remote_work(fleet: SimFleet, user: str | None, runs: int = 9) -> dict[str, float]:
    """CPU of one node's remote work, run locally as the login user (no SSH): baseline vs probe."""
    from benchmarks.worker import baseline_command
    from gpubot.config import load
    from gpubot.core.probe.snapshot import probe_argv

    node = load(fleet.config_path).nodes[0]
    devices = [f"{node.dev_prefix}{i}" for i in range(fleet.gpus)]
    devices += [f"{node.dev_prefix}ctl", f"{node.dev_prefix}-uvm"]
    cmds = {
        "baseline (2 queries)": ["sh", "-c", baseline_command(node.nvidia_smi)],
        "gpubot probe": probe_argv(node, smi_timeout_s=18.0),
        "fuser -v alone": ["fuser", "-v", *devices],
    }
    out = {}
    for name, argv in cmds.items():
        cpu = []
        for _ in range(runs):
            proc = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/", user=user
            )
            _, status, ru = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            cpu.append(ru.ru_utime + ru.ru_stime)
        out[name] = statistics.median(cpu)
    out["processes on the box"] = float(sum(1 for p in os.listdir("/proc") if p.isdigit()))
    return out


def spawn_workloads(fleet: SimFleet, per_node: int, user: str | None) -> None:
    """Put ``per_node`` GPU processes on every node (GPUs 0, 1, ...)."""
    for node in fleet.nodes:
        for g in range(min(per_node, fleet.gpus)):
            node.spawn(gpu=g, mib=2048 + 1024 * g, user=user)


async def fleet_snapshots(fleet: SimFleet) -> list[Any]:
    """Return the real snapshots of the fleet (for rendering Slack answers at 1,000 nodes)."""
    from gpubot.config import load
    from gpubot.services.status import StatusService
    from gpubot.transport import make_transport

    settings = load(fleet.config_path)
    transport = make_transport(settings.ssh)
    try:
        res = await StatusService(settings, transport).fleet(["all"])
        return list(res.snapshots)
    finally:
        await transport.close()


def run_status(a: argparse.Namespace, work: Path, user: str | None, res: dict[str, Any]) -> None:
    """Fleet status at every size (+ sweep, scaling, Slack at 1,000 nodes, the Slack burst)."""
    if "status" in a.parts:
        res["status"], res["warm"], res["remote_work"] = {}, {}, {}
    for n in a.sizes if "status" in a.parts else [max(a.sizes)]:
        d = work / f"fleet-{n}"
        d.mkdir()
        log(f"fleet of {n} nodes x {a.gpus} GPUs (sshd), {a.procs} GPU process(es) per node")
        t0 = time.monotonic()
        with fleet_as(SimFleet(d, nodes=n, gpus=a.gpus, server="sshd"), user) as fleet:
            spawn_workloads(fleet, a.procs, user)
            log(f"  started in {time.monotonic() - t0:.1f} s")
            if "status" in a.parts:
                res["remote_work"][n] = remote_work(fleet, user)
                if n == max(a.sizes):
                    res["execs"] = execs.count(fleet, user, a.procs)
                wd = work / f"status-{n}"
                wd.mkdir()
                series, extras = fleet_status.measure(
                    fleet, wd, a.method_list, a.repeat, a.slow_repeat, log
                )
                res["status"][n] = series
                res["warm"][n] = extras
                if n == min(a.sizes):  # what a cold status imports does not depend on N
                    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUBOT_")}
                    res["startup"] = fleet_status.startup(fleet.config_path, a.repeat, env)
            if n == max(a.sizes):
                snaps = asyncio.run(fleet_snapshots(fleet))
                res["slack_render"] = [
                    extrapolate.slack_at(snaps, 1000),
                    extrapolate.slack_at(snaps, 1000, failing=100),
                ]
                if "slack" in a.parts:
                    run_slack(a, fleet, work, res)


def run_slack(a: argparse.Namespace, fleet: SimFleet, work: Path, res: dict[str, Any]) -> None:
    """The acknowledgement burst, as gpubot is and with each experiment."""
    from benchmarks.experiments import NAMES

    config = slack_ack.write_config(fleet, work)
    res["slack"] = []
    # The bot as deployed (the fleet's work on the nodes' own CPUs: here the fleet yields this
    # box's CPU to the bot), then as on one shared box (the fleet at equal priority).
    runs = [(exp, True) for exp in ["", *[e for e in a.experiments.split(",") if e in NAMES]]]
    for exp, yields in [*runs, ("", False)]:
        label = "gpubot" if not exp else f"gpubot + {exp}"
        label += ", fleet yields CPU" if yields else ", fleet at equal CPU priority"
        log(
            f"  slack burst: {a.slack_requests} x /gpu status all over {fleet.size} nodes ({label})"
        )
        fy = FleetYields(sshd_listeners()) if yields else None
        if fy is not None and not fy.applied:
            label += " (could not apply: needs root and the cpu cgroup)"
        try:
            r = asyncio.run(slack_ack.burst(config, a.slack_requests, a.slack_wait, exp, label))
        finally:
            if fy is not None:
                fy.close()
        log(
            f"    ack p50/p99 {fmt_ms(r.p50)}/{fmt_ms(r.p99)} ms, busy {fmt_ms(r.busy_p50)}/"
            f"{fmt_ms(r.busy_p99)} ms, answered {r.answered}/{2 * r.requests}, "
            f"last {fmt_s(r.last_answer_s, 1)} s, bad {len(r.bad) + len(r.busy_bad)}, "
            f"loop stall max {fmt_ms(r.max_stall_s)} ms"
        )
        res["slack"].append(r)
        res["slack_nodes"] = fleet.size


def run_reset(a: argparse.Namespace, work: Path, user: str | None, res: dict[str, Any]) -> None:
    """Reset latency of a normal and a stubborn workload."""
    d = work / "fleet-reset"
    d.mkdir()
    log(f"reset: 1 node x {a.gpus} GPUs (sshd), release delay {a.release_delay} s")
    with fleet_as(
        SimFleet(d, nodes=1, gpus=a.gpus, server="sshd", release_delay_s=a.release_delay), user
    ) as fleet:
        series, info = asyncio.run(
            reset_latency.measure(fleet, d, a.reset_repeat, a.grace, user, log)
        )
    res["reset"], res["reset_info"] = series, info


def run_scale(a: argparse.Namespace, work: Path, user: str | None, res: dict[str, Any]) -> None:
    """A running bot over ``--scale-nodes`` asyncssh nodes: cold, warm ``status all``, a sweep."""
    d = work / "scale"
    d.mkdir()
    res["scale"] = scale.measure(d, a.scale_nodes, a.gpus, user, a.procs, a.scale_every, log)


# ---- the report ------------------------------------------------------------------------------


def _ratio(x: float | None, y: float | None) -> float | None:
    return None if x is None or y is None or y == 0 else x / y


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}×"


def _verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("met" if ok else "MISSED")


def report(a: argparse.Namespace, res: dict[str, Any], took: float) -> str:
    """Return the Markdown report."""
    m = res["machine"]
    quiet = "a busy machine: other work was running" if res["busy"] else "a quiet machine"
    out = [
        "## Measured results",
        "",
        f"Command: `{res['command']}` — took {took:.0f} s.",
        "",
        f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory']} RAM, Linux {m['kernel']}, "
        f"Python {m['python']}; load average at start {res['load_start']}, at end "
        f"{res['load_end']} ({quiet}).",
        "",
    ]
    if "status" in res:
        out += _status_tables(a, res)
    if "startup" in res:
        out += fleet_status.startup_report(res["startup"])
    if "reset" in res:
        out += _reset_table(res)
    if "scale" in res:
        out += scale.report(res["scale"], res.get("extrapolation"))
    if "slack" in res:
        out += _slack_table(res)
    if "probe" in res:
        out += res["probe"]
    if "status" in res or "slack" in res:
        out += _targets(res)
    return "\n".join(out).rstrip("\n") + "\n"


def _status_tables(a: argparse.Namespace, res: dict[str, Any]) -> list[str]:
    sizes = sorted(res["status"])
    header = ["method"]
    for n in sizes:
        header += [f"N={n} wall s", f"N={n} client CPU ms/node", f"N={n} server CPU ms/node"]
    rows = []
    for method in a.method_list:
        row = [method]
        for n in sizes:
            s: Series = res["status"][n][method]
            if s.missing:
                row += [s.missing, "", ""]
                continue
            runs = f" ({len(s.ok_samples())}/{len(s.samples)} ok)" if s.failures() else ""
            cpu, srv = s.median_cpu(), s.median_server_cpu()
            row += [
                fmt_s(s.median_wall(), 2) + runs,
                "-" if cpu is None else f"{cpu / n * 1000:.1f}",
                "-" if srv is None else f"{srv / n * 1000:.1f}",
            ]
        rows.append(row)
    lines = [
        "### Fleet status (median wall time of the runs; CPU per node)",
        "",
        f"{a.gpus} GPUs and {a.procs} GPU process(es) per node; {a.repeat} runs per method "
        f"(at most {a.slow_repeat} for ssh-seq and ansible), methods alternating in a rotating "
        "order. Client CPU: the method's own process tree (wait4) or, warm, the worker's "
        "getrusage. Server CPU: every sshd session and remote command (a cpuacct cgroup).",
        "",
        table(header, rows),
        "",
    ]
    rw = res.get("remote_work") or {}
    if rw:
        names = [k for k in next(iter(rw.values())) if k != "processes on the box"]
        rw_rows = [
            [str(n), str(int(rw[n]["processes on the box"]))]
            + [f"{rw[n][k] * 1000:.1f}" for k in names]
            for n in sorted(rw)
        ]
        lines += [
            "Remote work of one node, run locally as the login user (no SSH), median CPU ms. "
            "All simulated nodes share this box's /proc, which `fuser` scans whole:",
            "",
            table(["N", "processes on the box", *names], rw_rows),
            "",
        ]
    lines += execs.report(res.get("execs"))
    # Scaling: the running bot's memory and descriptors.
    warm = res.get("warm", {})
    pts: dict[int, dict[str, float]] = {}
    srows = []
    for n in sizes:
        g = warm.get(n, {}).get("gpubot")
        if not g:
            continue
        after = g.get("after_rounds") or {}
        rss, fds = after.get("rss_kib", g["rss_kib"]), after.get("fds", g["fds"])
        pts[n] = {"rss_kib": rss, "fds": fds}
        srows.append(
            [
                str(n),
                f"{g['rss_kib_built'] / 1024:.1f}",
                f"{rss / 1024:.1f}",
                f"{(rss - g['rss_kib_built']) / n:.0f}",
                str(g["fds_built"]),
                str(fds),
            ]
        )
    if srows:
        lines += [
            "### A running gpubot holding N pooled connections",
            "",
            table(
                [
                    "N",
                    "RSS built, not connected (MiB)",
                    "RSS connected, after the runs (MiB)",
                    "KiB per connection",
                    "fds built",
                    "fds connected",
                ],
                srows,
            ),
            "",
        ]
    cpu_pn = {}
    for n in sizes:
        s = res["status"][n].get("gpubot-warm")
        if s is not None and s.median_cpu() is not None:
            cpu_pn[n] = s.median_cpu() / n
    if len(pts) >= 1:
        x = extrapolate.extrapolate(pts, cpu_pn)
        res["extrapolation"] = x
        lines += _extrapolation(x, res, sizes)
    sweep = [(n, res["status"][n].get("gpubot-sweep")) for n in sizes]
    sweep_rows = [
        [str(n), fmt_s(s.median_wall(), 2), f"{(s.median_cpu() or 0) / n * 1000:.1f}"]
        for n, s in sweep
        if s is not None and s.median_cpu() is not None
    ]
    if sweep_rows:
        lines += [
            "### Sweep cost (a running bot's scheduled sweep: probe, findings, audit, alert state)",
            "",
            table(["N", "wall s", "bot CPU ms per node per sweep"], sweep_rows),
            "",
        ]
    return lines


def _extrapolation(x: dict[str, Any], res: dict[str, Any], sizes: list[int]) -> list[str]:
    t = x["target"]
    lines = [
        f"### Extrapolation to {t} nodes",
        "",
        f"- Memory: RSS = {x['rss_base_kib'] / 1024:.1f} MiB + {x['rss_per_node_kib']:.0f} KiB × N "
        f"(least squares over N = {', '.join(map(str, sizes))}) → "
        f"{x['rss_base_kib'] / 1024:.1f} + {x['rss_per_node_kib']:.0f} × {t} / 1024 = "
        f"**{x['rss_at_target_mib']:.0f} MiB**.",
        f"- File descriptors: {x['fds_base']:.1f} + {x['fds_per_node']:.2f} × N → "
        f"{x['fds_base']:.1f} + {x['fds_per_node']:.2f} × {t} = **{x['fds_at_target']:.0f}**, "
        f"against this shell's limit `ulimit -n` = {x['nofile_soft']} (hard {x['nofile_hard']}).",
    ]
    if x["cpu_per_node_s"] is not None:
        lines.append(
            f"- Bot CPU per warm `status all`: {x['cpu_per_node_s'] * 1000:.2f} ms/node (the "
            f"largest measured) × {t} = **{x['cpu_at_target_s']:.2f} s** of one core; with "
            f"`max_parallel = 64` the nodes go in ⌈{t}/64⌉ = {-(-t // 64)} waves."
        )
    for r in res.get("slack_render", []):
        lines.append(
            f"- Slack answer for {r['nodes']} nodes ({r['failing']} failing), rendered for real: "
            f"{r['blocks']} blocks (limit {r['limits']['blocks']}), longest text "
            f"{r['max_text_chars']} chars (limit {r['limits']['text']}), "
            f"{r['nodes_listed']} nodes listed in its table, limit problems: "
            f"{r['problems'] or 'none'}."
        )
    lines.append("")
    return lines


def _reset_table(res: dict[str, Any]) -> list[str]:
    info = res["reset_info"]
    rows = []
    for b, s in res["reset"].items():
        freed = [r for r in s.runs if r.outcome == "freed"]
        rows.append(
            [
                b,
                f"{len(freed)}/{len(s.runs)}",
                *[fmt_ms(s.median(seg)) for seg in reset_latency.SEGMENTS],
                fmt_ms(s.max("overhead")),
            ]
        )
    return [
        "### Reset latency (ms, median; request → freed)",
        "",
        f"Poll interval {info['poll_interval_s']} s (gpubot's default), grace period "
        f"{info['grace_s']} s, sim release delay {info['release_delay_s']} s plus a part of one "
        "poll interval that changes every repeat (so polls cannot line up with it); one warm SSH "
        "connection, audit in SQLite. Overhead = freed − (death + release delay): what gpubot "
        "adds beyond the sim's own delays.",
        "",
        table(
            [
                "workload",
                "freed",
                "planning",
                "signalling",
                "waiting for exit",
                "release delay",
                "verification overhead",
                "total",
                "overhead max",
            ],
            rows,
        ),
        "",
    ]


def _slack_table(res: dict[str, Any]) -> list[str]:
    rows = []
    for r in res["slack"]:
        waves = (
            ("idle", r.acks, r.bad, r.p50, r.p99),
            (
                f"then 1 every {r.busy_after_s:.1f} s, fleet work running",
                r.busy_acks,
                r.busy_bad,
                r.busy_p50,
                r.busy_p99,
            ),
        )
        for i, (when, acks, _bad, p50, p99) in enumerate(waves):
            rows.append(
                [
                    r.label if i == 0 else "",
                    when,
                    str(r.requests),
                    f"{len(acks)}",
                    fmt_ms(p50),
                    fmt_ms(p99),
                    fmt_ms(max(acks) if acks else None),
                    f"{r.answered}/{2 * r.requests}" if i == 0 else "",
                    fmt_s(r.last_answer_s, 1) if i == 0 else "",
                    fmt_ms(r.max_stall_s) if i == 0 else "",
                    _count(r.stalls_over_50ms) if i == 0 else "",
                ]
            )
    return [
        f"### Slack acknowledgement: bursts of concurrent signed `/gpu status all` over "
        f"{res['slack_nodes']} nodes",
        "",
        table(
            [
                "bot",
                "burst sent",
                "requests",
                "HTTP 200",
                "ack p50 ms",
                "ack p99 ms",
                "ack max ms",
                "answers posted (both bursts)",
                "last answer s",
                "bot loop stall max ms",
                "stalls > 50 ms",
            ],
            rows,
        ),
        "",
        "Bot loop stall: how late the bot's event-loop watch (a 20 ms timer) woke up at worst "
        "while serving both bursts (`gpubot_event_loop_max_stall_seconds`), and how many of its "
        "wake-ups came over 50 ms late; an ack waits behind a stall. It includes time the bot "
        "waited for a CPU that the fleet's servers held.",
        "",
    ]


def _count(n: int | None) -> str:
    return "-" if n is None else str(n)


def _targets(res: dict[str, Any]) -> list[str]:
    lines = ["### Ratios and targets", ""]
    if "status" in res:
        n = max(res["status"])
        st = res["status"][n]

        def wall(m: str) -> float | None:
            s = st.get(m)
            return s.median_wall() if s is not None else None

        r1 = _ratio(wall("gpubot-cold"), wall("pssh"))
        r2 = _ratio(wall("ssh-seq"), wall("gpubot-cold"))
        r3 = _ratio(wall("gpubot-warm"), wall("asyncssh-floor"))
        r4 = _ratio(wall("ssh-seq"), wall("gpubot-warm"))
        r5 = _ratio(wall("gpubot-warm"), wall("asyncssh-floor:probe"))
        res["ratios"] = {
            "N": n,
            "cold_vs_pssh": r1,
            "seq_vs_cold": r2,
            "warm_vs_floor": r3,
            "seq_vs_warm": r4,
            "warm_vs_floor:probe": r5,
        }
        lines += [
            *_cold_targets(res),
            f"At N = {n}:",
            "",
            f"- warm `status all` / asyncssh floor = {_x(r3)} (target ≤ 1.25×): "
            f"{_verdict(None if r3 is None else r3 <= TARGETS['warm_vs_floor'])}",
            f"- the same with equal remote work (the floor runs gpubot's probe) = {_x(r5)}: "
            f"{_verdict(None if r5 is None else r5 <= TARGETS['warm_vs_floor'])}",
            f"- sequential OpenSSH loop / warm = {_x(r4)}",
        ]
    for r in res.get("slack", []):
        worst = max([x for x in (r.p99, r.busy_p99) if x is not None], default=None)
        ok = None if worst is None else (worst < TARGETS["ack_p99_s"] and not r.bad + r.busy_bad)
        lines.append(
            f"- Slack ack p99 ({r.label}) = {fmt_ms(r.p99)} ms idle, {fmt_ms(r.busy_p99)} ms while "
            f"the fleet work runs (target < 300 ms): {_verdict(ok)}; the bot's longest event "
            f"loop stall {fmt_ms(r.max_stall_s)} ms"
        )
    lines.append("")
    return lines


def _cold_targets(res: dict[str, Any]) -> list[str]:
    """The cold ``status all`` ratios at every N (verdicts at ``COLD_SIZES``), and start-up."""
    rows, res["cold_ratios"] = [], {}
    for n in sorted(res["status"]):
        wall = {m: s.median_wall() for m, s in res["status"][n].items()}
        cold = wall.get("gpubot-cold")
        r = {
            "cold_vs_asyncssh_cold": _ratio(cold, wall.get("asyncssh-cold")),
            "cold_vs_pssh": _ratio(cold, wall.get("pssh")),
            "seq_vs_cold": _ratio(wall.get("ssh-seq"), cold),
            # Equal remote work: the baselines run gpubot's probe (see "pssh:probe" ...).
            "cold_vs_asyncssh_cold:probe": _ratio(cold, wall.get("asyncssh-cold:probe")),
            "cold_vs_pssh:probe": _ratio(cold, wall.get("pssh:probe")),
        }
        res["cold_ratios"][n] = r
        cells = [str(n)]
        for key, v in r.items():
            ok = None
            if v is not None and n in COLD_SIZES:
                limit = TARGETS[key.split(":")[0]]
                ok = v >= limit if key == "seq_vs_cold" else v <= limit
            cells.append(_x(v) + ("" if ok is None else f" {_verdict(ok)}"))
        rows.append(cells)
    header = [
        "N",
        "cold / asyncssh-cold (≤ 1.25×)",
        "cold / parallel-ssh (≤ 1.00×)",
        "sequential OpenSSH loop / cold (≥ 5×)",
        "cold / asyncssh-cold, same remote work",
        "cold / parallel-ssh, same remote work",
    ]
    sizes = " and ".join(map(str, COLD_SIZES))
    lines = [
        f"Cold `gpubot status all --json` at each N (the targets apply at N = {sizes}):",
        "",
        table(header, rows),
        "",
    ]
    st = res.get("startup")
    if st is not None:
        bad = st["forbidden_loaded"]
        lines += [
            f"- start-up: `gpubot status` imports {', '.join(bad) if bad else 'none'} of "
            f"{', '.join(fleet_status.NOT_FOR_STATUS)}: {_verdict(not bad)}; its imports take "
            f"{st['importtime_total_ms']:.0f} ms (`-X importtime`, see the start-up tables)",
            "",
        ]
    return lines


def to_json(res: dict[str, Any]) -> dict[str, Any]:
    """Return the raw figures as plain data."""
    out: dict[str, Any] = {k: v for k, v in res.items() if k not in ("status", "reset", "slack")}
    if "status" in res:
        out["status"] = {
            str(n): {
                m: {"samples": [s.__dict__ for s in ser.samples], "missing": ser.missing}
                for m, ser in series.items()
            }
            for n, series in res["status"].items()
        }
    if "reset" in res:
        out["reset"] = {b: [r.__dict__ for r in s.runs] for b, s in res["reset"].items()}
    if "slack" in res:
        out["slack"] = [r.__dict__ for r in res["slack"]]
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks; print the report."""
    a = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    res: dict[str, Any] = {
        "command": "python -m benchmarks.run " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(),
    }
    res["load_start"] = res["machine"]["load"]
    base = a.workdir or Path(tempfile.mkdtemp(prefix="gpubot-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="run-", dir=base))
    with bench_user() as user:
        if "status" in a.parts or "slack" in a.parts:
            run_status(a, work, user, res)
        if "reset" in a.parts:
            run_reset(a, work, user, res)
        if "scale" in a.parts:
            run_scale(a, work, user, res)
    if "probe" in a.parts:  # one node's probe, hostile cases, before and after its guards
        res["probe"] = probe_cost.run(20 if a.smoke else 200, a.repeat, 60.0)
    took = time.monotonic() - started
    res["load_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    # Busy: other work had the machine's cores half loaded or more before we began.
    res["busy"] = float(res["load_start"].split()[0]) > 0.5 * (os.cpu_count() or 1)
    if a.workdir is None:
        shutil.rmtree(base, ignore_errors=True)
    text = report(a, res, took)
    print(text)
    if a.out:
        a.out.write_text(text, encoding="utf-8")
    if a.json:
        a.json.write_text(json.dumps(to_json(res), indent=2, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
