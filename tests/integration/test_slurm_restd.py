"""Slurm read through the real slurmrestd (Debian's 22.05, JWT) and over the node's SSH, side
by side (issue 36): the same job with two GPUs reads the same either way, and a slurmrestd that
fails (a wrong token, no token, nothing listening) is a note over the SSH read, never "no jobs".

The simulated node's sessions run the real ``sinfo``, ``squeue`` and ``scontrol`` (wrappers on
PATH carry ``SLURM_CONF``); gres.conf's ``File=`` digits are the simulated GPUs' minors. Each
read builds the app as ``gpubot status`` does (``build(..., cold=True)``), with the token in the
environment it is given, never in the settings.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping

import pytest

from gpubot.app import build
from gpubot.config import Settings, load
from gpubot.core.slurm import SlurmSettings, SlurmView
from gpusim.fleet import SimFleet
from tests.fixtures.real_runs import real_fleet
from tests.fixtures.slurm import SlurmCluster, free_port
from tests.procs import wait_until


@pytest.fixture(scope="module")
def fleet(
    sim_users: tuple[str, ...],
    slurm_accounting: SlurmCluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SimFleet]:
    with real_fleet(
        tmp_path_factory.mktemp("slurm-restd"), ["slurm"], [slurm_accounting.bin_dir]
    ) as f:
        yield f


@pytest.fixture(scope="module")
def job(slurm_accounting: SlurmCluster, sim_users: tuple[str, ...]) -> Iterator[str]:
    """alice's running job allocated two GPUs (``--gres=gpu:2``)."""
    c = slurm_accounting
    job = c.sbatch(sim_users[0], "exec sleep 1000000", "train", gres="gpu:2")
    wait_until(lambda: bool(c.job_json(job)["gres_detail"]), 30, f"job {job} running")
    yield job
    c.cancel_all()


def settings(fleet: SimFleet, cluster: SlurmCluster, url: str | None) -> Settings:
    """The fleet's settings, node1 Slurm's; ``url``: read through that slurmrestd as root."""
    s = load(fleet.config_path)
    nodes = tuple(
        dataclasses.replace(n, scheduler="slurm", slurm_node=cluster.node_name)
        if n.name == "node1"
        else n
        for n in s.nodes
    )
    slurm = SlurmSettings(restd_url=url, restd_user=None if url is None else "root")
    return dataclasses.replace(s, nodes=nodes, slurm=slurm)


async def read(s: Settings, environ: Mapping[str, str]) -> tuple[SlurmView, int]:
    """node1's Slurm view, twice, as ``gpubot status`` reads it; and how many times slurmrestd's
    versions were asked."""
    app = build(s, environ, need_store=False, cold=True)
    try:
        node = app.status.node("node1")
        first = (await app.status.snapshot(node)).slurm
        second = (await app.status.snapshot(node)).slurm
        restd = app.status.slurm.restd
        assert first is not None and second is not None
        assert (first.node, first.jobs) == (second.node, second.jobs)
        return first, 0 if restd is None else restd.discoveries
    finally:
        await app.close()


def same(view: SlurmView) -> tuple[object, ...]:
    """What a view says of the node, apart from how and when it was read."""
    return (view.node, view.jobs, view.gres, view.error)


async def test_a_job_with_two_gpus_reads_the_same_through_slurmrestd_and_ssh(
    fleet: SimFleet, slurm_accounting: SlurmCluster, job: str, sim_users: tuple[str, ...]
) -> None:
    c = slurm_accounting
    ssh, asked = await read(settings(fleet, c, None), {})
    rest, asked = await read(settings(fleet, c, c.restd_url), {"SLURM_JWT": c.token("root")})
    assert ssh.source == "sinfo/squeue --json" and ssh.error is None
    assert rest.source == "slurmrestd v0.0.38" and rest.note is None  # 22.05 serves .36-.38
    assert asked == 1  # discovered once for both reads
    (alloc,) = [j for j in rest.jobs if j.job_id == job]
    assert alloc.user == sim_users[0] and len(alloc.gpu_idx) == 2 and not alloc.gpu_unknown
    assert rest.gres is not None and rest.gres.proven  # gres.conf over SSH beside slurmrestd
    assert same(rest) == same(ssh)


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("wrong token", r"slurmrestd v0\.0\.38 (node \S+|jobs): HTTP 500"),
        ("no token", r"slurmrestd not asked: \$SLURM_JWT is not set"),
        ("nothing listens", r"slurmrestd http://127\.0\.0\.1:\d+/openapi/v3: no connection"),
    ],
)
async def test_a_failing_slurmrestd_is_a_note_over_the_ssh_read(
    fleet: SimFleet, slurm_accounting: SlurmCluster, job: str, case: str, said: str
) -> None:
    c = slurm_accounting
    url = f"http://127.0.0.1:{free_port()}" if case == "nothing listens" else c.restd_url
    token = c.token("root")
    environ = {
        "wrong token": {"SLURM_JWT": token[:-4] + ("AAAA" if token[-4:] != "AAAA" else "BBBB")},
        "no token": {},
        "nothing listens": {"SLURM_JWT": token},
    }[case]
    control, _ = await read(settings(fleet, c, None), {})  # the SSH read alone
    view, _ = await read(settings(fleet, c, url), environ)
    assert view.note is not None and view.note.startswith("read over SSH: "), view.note
    assert re.search(said, view.note), view.note
    assert view.source == "sinfo/squeue --json"
    assert any(j.job_id == job for j in view.jobs)  # the job is still there: never "no jobs"
    assert same(view) == same(control)
