"""GPU-hours by allocation beside GPU-hours by use (issue 36), against the real one-node Slurm
22.05 with accounting (slurmdbd on MariaDB, ``AccountingStorageTRES=gres/gpu``) and the
simulated fleet whose node1 is Slurm's.

alice's job of two GPUs runs a few seconds and ends; bob's of one GPU too; alice's second job of
two GPUs keeps running and holds one of them, seen by two sweeps. ``gpubot report --by user``
(the CLI, a real process) then shows allocated hours beside observed hours; the test recomputes
the allocated hours by brute force, second by second, from ``sacct``'s own output, and
"allocated, unused" from the report's own observed hours. The control: the same fleet and
database with no scheduler named shows no allocation column.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpubot.app import build
from gpubot.config import Settings, load
from gpusim.fleet import SimFleet, SimNode
from tests.fixtures.daemons import need
from tests.fixtures.fleet import gpubot_cli
from tests.fixtures.real_runs import real_fleet
from tests.fixtures.slurm import SlurmCluster
from tests.procs import wait_until


@pytest.fixture(scope="module")
def fleet(
    sim_users: tuple[str, ...],
    slurm_accounting: SlurmCluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SimFleet]:
    with real_fleet(
        tmp_path_factory.mktemp("slurm-acct"), ["slurm"], [slurm_accounting.bin_dir]
    ) as f:
        yield f


def configs(fleet: SimFleet, cluster: SlurmCluster, folder: Path) -> tuple[Path, Path]:
    """Return two settings files over one database: node1 Slurm's, and the control (node1 with
    no scheduler). Sweeps every 5 s, so that a first sample counts 5 s."""
    db = folder / "gpubot.db"
    text = re.sub(
        r'(?m)^url = "sqlite:///.*"$', f'url = "sqlite:///{db}"', fleet.config_path.read_text()
    )
    text += "\n[sweep]\ninterval_s = 5\nbudget_s = 5\n"
    slurm, n = re.subn(
        r'(?m)^name = "node1"$',
        f'name = "node1"\nscheduler = "slurm"\nslurm_node = "{cluster.node_name}"',
        text,
    )
    assert n == 1
    (folder / "slurm.toml").write_text(slurm)
    (folder / "plain.toml").write_text(text)
    assert gpubot_cli(folder / "slurm.toml", "db", "upgrade").returncode == 0
    return folder / "slurm.toml", folder / "plain.toml"


def sacct_rows(cluster: SlurmCluster) -> list[dict[str, str]]:
    """Return ``sacct``'s own rows (its default ISO times, under TZ=UTC)."""
    fields = ["JobID", "User", "AllocTRES", "Start", "End", "State"]
    out = cluster.cli(
        "-X", "-a", "-n", "-P", f"--format={','.join(fields)}", program=need("sacct", "slurm-wlm")
    )
    return [dict(zip(fields, r.split("|"), strict=True)) for r in out.stdout.splitlines()]


def utc(text: str) -> int:
    return int(time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S")) - time.timezone)


def brute_ms(rows: list[dict[str, str]], since: int, now: int) -> dict[str, int]:
    """Return each user's GPU-ms from sacct's rows, one second at a time over [since, now)."""
    out: dict[str, int] = {}
    for r in rows:
        gpus = [
            int(t.split("=")[1]) for t in r["AllocTRES"].split(",") if t.startswith("gres/gpu=")
        ]
        if not gpus or r["Start"] == "Unknown":
            continue
        start = utc(r["Start"])
        end = now if r["End"] == "Unknown" else utc(r["End"])
        for s in range(since, now):
            if start <= s < end:
                out[r["User"]] = out.get(r["User"], 0) + gpus[0] * 1000
    return out


async def sweeps(settings: Settings, n: int) -> None:
    app = build(settings, {}, need_store=True)
    try:
        for i in range(n):
            if i:
                await asyncio.sleep(1.0)
            await app.sweep.run(alerting=False)
    finally:
        await app.close()


def report(config: Path, *args: str) -> tuple[dict[str, Any], float, float]:
    """Return ``gpubot report --by user --since 1h --json`` and the times around it."""
    before = time.time()
    out = gpubot_cli(config, "report", "--since", "1h", "--json", *args)
    after = time.time()
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), before, after


def test_allocated_hours_beside_observed_recomputed_from_sacct(
    fleet: SimFleet,
    slurm_accounting: SlurmCluster,
    sim_users: tuple[str, ...],
    tmp_path: Path,
) -> None:
    c = slurm_accounting
    alice, bob = sim_users
    node: SimNode = fleet.node("node1")
    config, plain = configs(fleet, c, tmp_path)
    try:
        short = c.sbatch(alice, "sleep 3", "short", gres="gpu:2")
        tiny = c.sbatch(bob, "sleep 2", "tiny", gres="gpu:1")

        def ended() -> bool:
            rows = {r["JobID"]: r for r in sacct_rows(c)}
            return all(
                j in rows and rows[j]["State"] == "COMPLETED" and rows[j]["End"] != "Unknown"
                for j in (short, tiny)
            )

        wait_until(ended, 60, f"sacct: jobs {short}, {tiny} COMPLETED")
        script = f'g=${{SLURM_JOB_GPUS%%,*}}; exec 3<>{node.dev_prefix}"$g"; exec sleep 1000000'
        long = c.sbatch(alice, script, "long", gres="gpu:2")
        wait_until(lambda: bool(c.job_json(long)["gres_detail"]), 30, f"job {long} running")
        # slurmctld tells slurmdbd of a start on its own time: on a loaded box the report could
        # read sacct before the running job is there, which the brute force (read after) has.
        wait_until(
            lambda: any(r["JobID"] == long and r["Start"] != "Unknown" for r in sacct_rows(c)),
            30,
            f"sacct: job {long} started",
        )
        (detail,) = c.job_json(long)["gres_detail"]
        used = int(re.fullmatch(r"gpu(?::\d+)?\(IDX:(\d+)-\d+\)", detail)[1])  # type: ignore[index]
        node.adopt(c.holder(long, node.device(used)), used, 3000)
        asyncio.run(sweeps(load(config), 2))

        doc, before, after = report(config, "--by", "user")
        rows = sacct_rows(c)
        assert doc["slurm"]["allocation"] is True, doc["slurm"]
        got = {r["user"]: r for r in doc["rows"]}
        assert {alice, bob} <= set(got), got
        since = doc["since"]
        low = brute_ms(rows, since, math.floor(before))
        high = brute_ms(rows, since, math.ceil(after))
        assert low[bob] == high[bob] == got[bob]["allocated_ms"] >= 2000  # ended: exact
        assert low[alice] <= got[alice]["allocated_ms"] <= high[alice], (low, got[alice], high)
        assert low[alice] >= 2 * 3000 + 2 * 1000  # the short job's, and the long one's so far
        for user in (alice, bob):
            r = got[user]
            seen = r["busy_ms"] + r["idle_ms"] + r["unknown_ms"]
            assert r["allocated_unused_ms"] == max(0, r["allocated_ms"] - seen), r
        assert got[bob]["busy_ms"] + got[bob]["idle_ms"] == 0  # bob held nothing
        assert got[alice]["busy_ms"] + got[alice]["idle_ms"] + got[alice]["unknown_ms"] >= 5000
        assert 0 < got[alice]["allocated_unused_ms"] < got[alice]["allocated_ms"]
        assert any("sacct on node1" in n for n in doc["slurm"]["notes"]), doc["slurm"]

        text = gpubot_cli(config, "report", "--by", "user", "--since", "1h").stdout
        assert re.search(r"allocated h +alloc\. unused h", text), text
        assert f"most allocated, unused: {alice} " in text
        by_node, _, _ = report(config, "--by", "node")
        assert by_node["slurm"] == {
            "allocation": False,
            "notes": ["allocated h: by user or team only"],
        }

        control, _, _ = report(plain, "--by", "user")  # node1 names no scheduler
        assert control["slurm"] == {"allocation": False, "notes": []}
        assert all("allocated_ms" not in r for r in control["rows"]) and control["rows"]
        assert "allocated" not in gpubot_cli(plain, "report", "--since", "1h").stdout
    finally:
        c.cancel_all()
        node.clear()
