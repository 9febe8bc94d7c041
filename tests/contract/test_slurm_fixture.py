"""The real Slurm fixtures (``tests.fixtures.slurm``) against their real daemons: GPUs as GRES,
accounting in slurmdbd on MariaDB, slurmrestd with JWTs, and a drained node.

What Slurm 22.05.8 prints here is what gpubot's parsers will read: the tests pin the fields
(``gres_detail``, AllocTRES's ``gres/gpu=N``, ``state_flags``) as the daemons write them.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from pathlib import Path

import pytest

from tests.fixtures.daemons import need
from tests.fixtures.slurm import DB_PREFIX, GPU_MAJOR, SlurmCluster, mariadb
from tests.procs import wait_until

SACCT_FORMAT = "JobID,User,Account,AllocTRES,Start,End,Elapsed,State"


def running_job(
    cluster: SlurmCluster, user: str, name: str, gres: str | None, time_limit: str | None = None
) -> str:
    """Submit ``sleep`` as ``user``; return its id once it runs."""
    job = cluster.sbatch(user, "exec sleep 1000000", name, gres=gres, time_limit=time_limit)
    wait_until(lambda: cluster.state(job) == "RUNNING", 30, f"job {job} running")
    return job


def indices(detail: str) -> list[int]:
    """Return the GPU indices of ``gpu:N(IDX:0-1,3)``."""
    m = re.fullmatch(r"gpu:\d+\(IDX:([\d,-]+)\)", detail)
    assert m, detail
    out: list[int] = []
    for part in m.group(1).split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def sacct(cluster: SlurmCluster) -> dict[str, dict[str, str]]:
    """Return ``sacct -X -a -P``'s rows by job id."""
    out = cluster.cli(
        "-X", "-a", "-P", f"--format={SACCT_FORMAT}", program=need("sacct", "slurm-wlm")
    ).stdout
    header, *rows = out.splitlines()
    keys = header.split("|")
    return {r.split("|")[0]: dict(zip(keys, r.split("|"), strict=True)) for r in rows}


# ---- GPUs as GRES ------------------------------------------------------------------------


def test_gres_files_are_nvidia_character_devices_of_the_fixture(
    slurm_cluster: SlurmCluster,
) -> None:
    c = slurm_cluster
    assert c.gpus == 4 and len(c.gres_files) == 4
    for minor, path in enumerate(c.gres_files):
        st = os.stat(path)
        assert stat.S_ISCHR(st.st_mode), path
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (GPU_MAJOR, minor)
        assert Path(path).is_relative_to(c.root)  # never under /dev
    gres_conf = (c.root / "etc" / "gres.conf").read_text().splitlines()
    assert gres_conf == ["AutoDetect=off", *(f"Name=gpu File={f}" for f in c.gres_files)]
    node = c.cli("show", "node", c.node_name).stdout
    assert "Gres=gpu:4" in node
    assert "gres/gpu" not in node  # no AccountingStorageTRES: it needs slurmdbd
    assert "not a valid character" not in (c.root / "slurmd.log").read_text()


def test_a_gpu_job_shows_its_indices(
    slurm_cluster: SlurmCluster, sim_users: tuple[str, ...]
) -> None:
    c = slurm_cluster
    alice, bob = sim_users
    two = running_job(c, alice, "two-gpus", "gpu:2", time_limit="5")
    one = running_job(c, bob, "one-gpu", "gpu:1")
    plain = running_job(c, bob, "no-gpu", None)  # the control: no GRES, no indices
    try:
        shown = {j: c.cli("-d", "show", "job", j).stdout for j in (two, one, plain)}
        details = {j: re.findall(r"\bGRES=(\S+)", shown[j]) for j in shown}
        assert len(details[two]) == 1 and len(indices(details[two][0])) == 2, shown[two]
        assert len(details[one]) == 1 and len(indices(details[one][0])) == 1, shown[one]
        assert details[plain] == [], shown[plain]
        assert not set(indices(details[two][0])) & set(indices(details[one][0]))  # no sharing
        assert "TimeLimit=00:05:00" in shown[two] and "TimeLimit=UNLIMITED" in shown[one]
        docs = {j: c.job_json(j) for j in shown}
        assert docs[two]["gres_detail"] == details[two]  # e.g. ["gpu:2(IDX:0-1)"]
        assert docs[one]["gres_detail"] == details[one]
        assert docs[plain]["gres_detail"] == []
        assert docs[two]["tres_per_node"] == "gres:gpu:2"
        assert docs[two]["user_name"] == alice and docs[two]["time_limit"] == 5
        node = c.node_json()
        assert (node["gres"], node["gres_used"]) == ("gpu:4", "gpu:3")
    finally:
        c.cancel_all()


def test_a_drained_node_and_its_reason(slurm_cluster: SlurmCluster) -> None:
    c = slurm_cluster
    sinfo = need("sinfo", "slurm-wlm")
    wait_until(c.idle, 30, "the node idle")  # no job of another test completing
    reason = "gpubot test: GPU 2 fell off the bus"
    assert c.cli("-R", "-h", program=sinfo).stdout.strip() == ""  # the control: none drained
    assert c.node_json()["state_flags"] == []
    c.cli("update", f"NodeName={c.node_name}", "State=DRAIN", f"Reason={reason}")
    try:
        listed = c.cli("-R", "-h", "-o", "%N|%T|%E|%u", program=sinfo).stdout.strip()
        assert listed == f"{c.node_name}|drained|{reason}|root"
        node = c.node_json()
        assert (node["state"], node["state_flags"]) == ("idle", ["DRAIN"])
        assert (node["reason"], node["reason_set_by_user"]) == (reason, "root")
        assert abs(node["reason_changed_at"] - time.time()) < 120
        assert f"Reason={reason} [root@" in c.cli("show", "node", c.node_name).stdout
    finally:
        c.cli("update", f"NodeName={c.node_name}", "State=RESUME")
    # Just after RESUME sinfo may print "idle*" (not responding) until slurmctld pings slurmd.
    wait_until(c.idle, 30, "the node idle again")
    assert c.node_json()["state_flags"] == [] and c.node_json()["reason"] == ""


# ---- accounting: slurmdbd on MariaDB ------------------------------------------------------


def test_sacct_lists_gpu_jobs_running_and_finished(
    slurm_accounting: SlurmCluster, sim_users: tuple[str, ...]
) -> None:
    c = slurm_accounting
    alice, bob = sim_users
    done = c.sbatch(alice, "sleep 1", "short", gres="gpu:2")
    live = running_job(c, bob, "long", "gpu:1")
    try:

        def finished() -> bool:
            row = sacct(c).get(done)
            return row is not None and row["State"] == "COMPLETED" and row["End"] != "Unknown"

        wait_until(finished, 60, f"sacct: job {done} COMPLETED")
        rows = sacct(c)
        d, r = rows[done], rows[live]
        assert (d["User"], d["Account"]) == (alice, "gpusim")
        assert "gres/gpu=2" in d["AllocTRES"].split(","), d
        assert (r["User"], r["State"], r["End"]) == (bob, "RUNNING", "Unknown")
        assert "gres/gpu=1" in r["AllocTRES"].split(","), r
        assert re.fullmatch(r"\d\d:\d\d:\d\d", d["Elapsed"]) and d["Start"] <= d["End"]
    finally:
        c.cancel_all()


def test_teardown_drops_the_database_and_its_user() -> None:
    cluster = SlurmCluster(accounting=True)
    try:
        cluster.start()
        db = cluster.database
        assert db.startswith(DB_PREFIX)
        assert mariadb(f"SHOW DATABASES LIKE '{db}'").stdout.split() == [db]  # the control
        assert set(cluster.timings) == {"slurmdbd", "slurmctld+slurmd"}
        assert all(0 < s < 60 for s in cluster.timings.values()), cluster.timings
    finally:
        cluster.stop()
    assert mariadb(f"SHOW DATABASES LIKE '{db}'").stdout.split() == []
    users = mariadb(f"SELECT user FROM mysql.user WHERE user = '{db}'").stdout.split()
    assert users == []
    assert not cluster.root.exists()


# ---- slurmrestd with JWTs ----------------------------------------------------------------


def test_slurmrestd_answers_with_a_token_and_refuses_without(
    slurm_accounting: SlurmCluster, sim_users: tuple[str, ...]
) -> None:
    c = slurm_accounting
    alice, _ = sim_users
    job = running_job(c, alice, "rest", "gpu:2")
    try:
        token = c.token(alice)
        status, body = c.rest_get("/openapi/v3", alice, token)
        assert status == 200, body
        paths = json.loads(body)["paths"]
        assert {"/slurm/v0.0.38/jobs", "/slurm/v0.0.38/nodes", "/slurmdb/v0.0.38/jobs"} <= set(
            paths
        )
        status, body = c.rest_get("/slurm/v0.0.38/jobs", alice, token)
        assert status == 200, body
        doc = json.loads(body)
        assert doc["meta"]["plugin"]["type"] == "openapi/v0.0.38" and doc["errors"] == []
        (mine,) = [j for j in doc["jobs"] if str(j["job_id"]) == job]
        assert mine["gres_detail"] == c.job_json(job)["gres_detail"]
        assert len(indices(mine["gres_detail"][0])) == 2
        assert "gres/gpu=2" in mine["tres_alloc_str"].split(",")  # AccountingStorageTRES
        status, body = c.rest_get("/slurm/v0.0.38/nodes", alice, token)
        assert status == 200, body
        (node,) = [n for n in json.loads(body)["nodes"] if n["name"] == c.node_name]
        assert (node["gres"], node["gres_used"]) == ("gpu:4", "gpu:2")
        # The controls: no token, or one header alone, is refused; a wrong token too.
        for path in ("/openapi/v3", "/slurm/v0.0.38/jobs", "/slurm/v0.0.38/nodes"):
            assert c.rest_get(path)[0] == 401, path
            assert c.rest_get(path, alice)[0] == 401, path
            assert c.rest_get(path, None, token)[0] == 401, path
        status, body = c.rest_get("/slurm/v0.0.38/jobs", alice, "not-a-token")
        assert status == 500 and json.loads(body)["errors"], body
    finally:
        c.cancel_all()


@pytest.mark.parametrize("path", ["/slurm/v0.0.39/jobs", "/nonexistent"])
def test_slurmrestd_has_no_such_path(slurm_accounting: SlurmCluster, path: str) -> None:
    c = slurm_accounting
    status, body = c.rest_get(path, "root", c.token("root"))
    assert status == 404, body
