"""GPU-hours against a brute force over the raw samples, on memory, SQLite and PostgreSQL.

A generated history (three nodes of two GPUs, 30 hours of sweeps every 15 minutes; a node
down for hours, the bot down for all, sweeps by hand between the scheduled ones, one twice at
the same instant, GPUs shared, held by nobody or by a process whose owner is unknown, busy,
idle and unknown utilisation, claims used and unused) goes sweep by sweep through the real
``UsageService`` and ``DbUsage`` (the incremental buckets). The test keeps the raw samples it
generated and computes every figure again by another method: all of a GPU's samples sorted,
each weighed by the gap to the one before, summed over the window. The report by user, team
and node, its sweeps and its gaps must be exactly these, in milliseconds; and `gpubot report`
(the CLI as a process) prints the same.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from gpubot.config import Settings
from gpubot.core.findings import SweepConfig
from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.usage.report import ReportSettings
from gpubot.services.usage import Interval, UsageService
from gpubot.store import Store, open_store
from tests.fixtures.db import not_in_memory
from tests.fixtures.settings import ManualClock

H = 3600
INTERVAL = 900.0
T0 = 1_900_000_000.0 - (1_900_000_000 % H) + 600  # ten minutes into an hour
NODES = ("n1", "n2", "n3")
GPUS = 2
USERS = ("alice", "bob", "carol", "dave")
TEAMS = (("vision", ("alice", "bob")), ("ops", ("alice", "carol")))
KINDS = ("busy", "idle", "unknown", "unused", "free")


@dataclass(frozen=True)
class Raw:
    """One GPU at one sweep, as the test generated it (the truth)."""

    at: float
    node: str
    gpu: int
    util: int | None
    owners: tuple[str, ...]  # sorted, distinct; "(unknown)" for a process nobody owns


class Claims:
    """The claims port, over a fixed list of intervals."""

    def __init__(self, intervals: list[Interval]) -> None:
        self.list = intervals

    def intervals(self, since: float, until: float) -> Iterable[Interval]:
        return [c for c in self.list if c[3] <= until and c[4] >= since]


class Groups:
    """A directory whose user group S0NLP holds Dave's and Eve's Slack ids."""

    async def group_members(self, group_id: str) -> frozenset[str]:
        return frozenset({"U0DAVE", "U0EVE"}) if group_id == "S0NLP" else frozenset()

    async def account(self, user_id: str) -> None:
        return None

    async def home_team(self) -> None:
        return None


def process(pid: int, gpu: int, user: str | None) -> GpuProcess:
    return GpuProcess(
        pid, gpu, 8192, "python3", True, True, user=user, state="S", start_ticks=pid, uid=1000
    )


def history(seed: int) -> tuple[list[tuple[float, list[NodeSnapshot]]], list[Raw]]:
    """Return the sweeps (time, snapshots) and the raw samples they hold."""
    rng = random.Random(seed)
    sweeps: list[tuple[float, list[NodeSnapshot]]] = []
    raw: list[Raw] = []
    times = [T0 + i * INTERVAL for i in range(120)]
    times = [t for t in times if not T0 + 50 * INTERVAL <= t < T0 + 58 * INTERVAL]  # bot down
    times += [T0 + 10 * INTERVAL + 200.0, T0 + 30 * INTERVAL + 7.5]  # sweeps by hand
    times += [T0 + 70 * INTERVAL]  # the same instant twice: counted once
    for at in sorted(times):
        snaps = []
        for node in NODES:
            if node == "n2" and T0 + 20 * INTERVAL <= at < T0 + 31 * INTERVAL:
                continue  # n2 down for hours
            gpus, procs = [], []
            for g in range(GPUS):
                util = rng.choice([0, 0, 0, 35, 90, None])
                who = rng.choice([(), ("alice",), ("bob",), ("carol",), ("alice", "bob"), (None,)])
                for i, u in enumerate(who):
                    procs.append(process(1000 + 10 * g + i, g, u))
                gpus.append(GpuInfo(g, f"GPU-{node}-{g}", "H200", 8192, 143771, util, minor=g))
                owners = tuple(sorted({u or "(unknown)" for u in who}))
                raw.append(Raw(at, node, g, util, owners))
            snaps.append(NodeSnapshot(node, at, tuple(gpus), tuple(procs)))
        sweeps.append((at, snaps))
    return sweeps, raw


CLAIMS: list[Interval] = [
    ("n1", 0, "alice", T0 + 5 * INTERVAL, T0 + 40 * INTERVAL),
    ("n3", 1, "dave", T0 + 60 * INTERVAL, T0 + 100 * INTERVAL),  # dave holds nothing: unused
    ("n2", 1, "bob", T0 + 15 * INTERVAL + 1.0, T0 + 25 * INTERVAL),
]


def brute(raw: list[Raw], since: float, until: float) -> dict[tuple[str, str], dict[str, int]]:
    """Every figure again, from all the raw samples: {(by, name): {kind: ms, "samples": n}}."""
    out: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    per_gpu: dict[tuple[str, int], list[Raw]] = defaultdict(list)
    for r in raw:
        per_gpu[(r.node, r.gpu)].append(r)
    teams = {**dict(TEAMS), "nlp": ("dave",)}
    for samples in per_gpu.values():
        samples.sort(key=lambda r: r.at)
        prev: float | None = None
        for r in samples:
            if prev is not None and r.at <= prev:
                w = 0
            elif prev is None or r.at - prev > 2 * INTERVAL:
                w = int(INTERVAL * 1000)
            else:
                w = round((r.at - prev) * 1000)
            prev = r.at
            if not since <= r.at < until:
                continue
            kind = (
                "free"
                if not r.owners
                else "unknown"
                if r.util is None
                else ("busy" if r.util > 0 else "idle")
            )
            node = out[("node", r.node)]
            node[kind] += w
            node["samples"] += 1
            k = len(r.owners)
            for i, u in enumerate(r.owners):
                part = w // k + (1 if i < w % k else 0)
                out[("user", u)][kind] += part
                out[("user", u)]["samples"] += 1
                for team in [t for t, us in teams.items() if u in us] or ["(no team)"]:
                    out[("team", team)][kind] += part
                    out[("team", team)]["samples"] += 1
            for n, gpu, user, start, end in CLAIMS:
                covers = (n, gpu) == (r.node, r.gpu) and start <= r.at < end
                if covers and (user not in r.owners or r.util == 0):
                    node["unused"] += w
                    out[("user", user)]["unused"] += w
                    for team in [t for t, us in teams.items() if user in us] or ["(no team)"]:
                        out[("team", team)]["unused"] += w
    return out


def settings_for(db_url: str = "memory://") -> Settings:
    reports = ReportSettings(teams=TEAMS, team_groups=(("nlp", "S0NLP"),))
    s = Settings(database_url=db_url, sweep=SweepConfig(interval_s=INTERVAL), reports=reports)
    return replace(s, policy=replace(s.policy, users={"U0DAVE": "dave", "U0EVE": "eve"}))


def rows_of(doc: dict[str, object], by: str) -> dict[tuple[str, str], dict[str, int]]:
    rows = doc["rows"]
    assert isinstance(rows, list)
    out = {}
    for row in rows:
        kinds = {k: row[f"{k}_ms"] for k in KINDS if f"{k}_ms" in row}
        out[(by, row[by])] = {**kinds, "samples": row["samples"]}
    return out


def expected(
    truth: dict[tuple[str, str], dict[str, int]], by: str
) -> dict[tuple[str, str], dict[str, int]]:
    want = {}
    for (b, name), figs in truth.items():
        if b != by:
            continue
        kinds = {k: figs.get(k, 0) for k in KINDS if by == "node" or k != "free"}
        want[(b, name)] = {**kinds, "samples": figs.get("samples", 0)}
    return want


@pytest.mark.parametrize("seed", [1, 7])
async def test_the_report_is_the_brute_force_over_the_raw_samples(store: Store, seed: int) -> None:
    sweeps, raw = history(seed)
    svc = UsageService(settings_for(), store.usage, claims=Claims(CLAIMS), directory=Groups())
    for at, snaps in sweeps:
        await svc.record(snaps, at)
    end = T0 + 119 * INTERVAL + 60  # a minute after the last sweep: no node silent since
    svc.clock = ManualClock(end)
    for since, until in [("2d", None), ("2030-03-17T05:00", "2030-03-17T20:00"), ("9h", "3h")]:
        for by in ("user", "team", "node"):
            report = await svc.report(since, until, by=by)
            w = report.window
            truth = brute(raw, w.since, w.until)
            assert rows_of(report.to_dict(), by) == expected(truth, by), (since, until, by)
            assert report.coverage.sweeps == len(
                {i for i, (at, _) in enumerate(sweeps) if w.since <= at < w.until}
            )
    whole = await svc.report("2d", None, by="node")
    assert whole.coverage.sweeps == len(sweeps)
    gaps = {(g.node, g.start, g.end) for g in whole.coverage.gaps}
    # n2 missed 11 sweeps; the bot was down for 8 (every node); nothing else is missing
    down = [(n, T0 + 49 * INTERVAL, T0 + 58 * INTERVAL) for n in NODES]
    assert gaps == {("n2", T0 + 19 * INTERVAL, T0 + 31 * INTERVAL), *down}
    text = whole.text()
    assert f"{len(sweeps)} sweep(s) in" in text and "data missing in 4 stretch(es):" in text
    users = {ln.name for ln in (await svc.report("2d", None, by="user")).lines}
    assert users == {"alice", "bob", "carol", "(unknown)", "dave"}  # dave: a claim, unused


async def test_a_node_silent_since_is_an_open_gap_and_bad_windows_are_one_line(
    store: Store,
) -> None:
    sweeps, _ = history(3)
    svc = UsageService(settings_for(), store.usage)
    for at, snaps in sweeps[:20]:
        await svc.record(snaps, at)
    last = sweeps[19][0]
    svc.clock = ManualClock(last + 5 * INTERVAL)
    report = await svc.report("1d", None, by="node")
    assert {(g.node, g.end) for g in report.coverage.gaps} == {(n, None) for n in NODES}
    assert "now (no sample since)" in report.text()
    from gpubot.errors import UsageError

    for since, until, said in [
        ("yesterday", None, "bad --since 'yesterday': expected a duration ago"),
        ("1d", "2020-13-01", "bad --until '2020-13-01'"),
        ("1h", "2d", "must be before --until"),
    ]:
        with pytest.raises(UsageError, match=said) as err:
            await svc.report(since, until)
        assert "\n" not in str(err.value)
    with pytest.raises(UsageError, match="bad --by 'gpu'"):
        await svc.report("1d", None, by="gpu")


def test_gpubot_report_prints_the_same_figures(
    db_kind: str, fresh_db_url: str, tmp_path: Path
) -> None:
    """The CLI as a process: JSON, CSV, text; a bad --since is one line and status 2."""
    not_in_memory(db_kind, "is not reachable from another process (the CLI)")
    import asyncio

    sweeps, raw = history(5)
    store = open_store(fresh_db_url)
    try:
        svc = UsageService(settings_for(fresh_db_url), store.usage, claims=Claims(CLAIMS))

        async def feed() -> None:
            for at, snaps in sweeps:
                await svc.record(snaps, at)

        asyncio.run(feed())
    finally:
        store.close()
    config = tmp_path / "gpubot.toml"
    config.write_text(
        f'[database]\nurl = "{fresh_db_url}"\n[sweep]\ninterval_s = {INTERVAL}\n'
        '[teams]\nvision = ["alice", "bob"]\nops = ["alice", "carol"]\nnlp = ["dave"]\n'
    )
    since, until = "2030-03-17T00:00", "2030-03-20T00:00"
    env = {k: v for k, v in os.environ.items() if k != "GPUBOT_CONFIG"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "gpubot", "--config", str(config), "report", *args]
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)

    for by in ("user", "team", "node"):
        out = cli("--since", since, "--until", until, "--by", by, "--json")
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        truth = brute(raw, doc["since"], doc["until"])
        assert rows_of(doc, by) == expected(truth, by)
        assert doc["sweeps"] == len(sweeps)
    out = cli("--since", since, "--until", until, "--csv")
    assert (
        out.returncode == 0
        and out.stdout.splitlines()[0] == "user,busy_h,idle_h,unknown_h,unused_h,samples"
    )
    out = cli("--since", since, "--until", until, "--by", "team")
    assert (
        out.returncode == 0
        and "GPU-hours by team, 2030-03-17 00:00 to 2030-03-20 00:00 UTC" in out.stdout
    )
    assert "data missing in 4 stretch(es):" in out.stdout
    bad = cli("--since", "last tuesday")
    assert bad.returncode == 2 and bad.stdout == ""
    assert len(bad.stderr.strip().splitlines()) == 1 and "bad --since 'last tuesday'" in bad.stderr
