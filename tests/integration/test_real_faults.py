"""What real boxes do and the first simulator did not: lost GPUs, infoROM warnings, odd values.

Each case on the simulated fleet through status (text and ``--json``), reset, gpu-reset and a
sweep. Formats: nvidia-smi(1) RETURN VALUE (14: infoROM corrupted, 15: GPU fallen off the bus);
the "Unable to determine the device handle" line in the three shapes public bug reports quote.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpubot.config import Settings
from gpubot.core.findings import GPU_LOST, SMI_FAILED
from gpubot.core.models import Outcome
from gpubot.core.reset.plan import ResetRequest
from gpubot.errors import CommandTimeout, ResetRefused, SmiFailed
from gpubot.services.reset import Ask, NodeLocks, ResetService
from gpubot.services.status import StatusService
from gpubot.services.sweep import SweepService
from gpubot.store import Store
from gpubot.transport import make_transport
from gpusim.fleet import SimFleet, SimNode
from tests.fixtures.fleet import gpubot_cli, reset_fixtures, status_notes
from tests.fixtures.settings import sweep_ports, with_sweep
from tests.procs import alive


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(
        tmp_path_factory.mktemp("faults"), nodes=1, gpus=4, release_delay_s=0.3, minors=[1, 0, 3, 2]
    ) as f:
        env = {k: v for k, v in os.environ.items() if k != "GPUBOT_CONFIG"}
        subprocess.run(
            [sys.executable, "-m", "gpubot", "--config", str(f.config_path), "db", "upgrade"],
            check=True,
            capture_output=True,
            env=env,
        )
        yield f


settings, store, engine, node = reset_fixtures()


def cli_status(fleet: SimFleet, *args: str) -> subprocess.CompletedProcess[str]:
    return gpubot_cli(fleet.config_path, "status", *args)


async def sweep_kinds(settings: Settings, store: Store, engine: ResetService) -> set[str]:
    svc = SweepService(
        s := with_sweep(settings, interval_s=60),
        engine.status,
        engine.transport,
        sweep_ports(s, store),
        replica="test",
    )
    result = await svc.run()
    return {f"{f.kind}:{f.gpu}" for f in result.findings}


@pytest.mark.parametrize("style", ["index-bus", "bus", "index"])
async def test_a_lost_gpu_is_flagged_and_the_others_still_work(
    engine: ResetService,
    store: Store,
    settings: Settings,
    fleet: SimFleet,
    node: SimNode,
    style: str,
) -> None:
    job = node.spawn(gpu=1, mib=2000)
    node.set_fault("lost", gpu=2, style=style)
    snap = await engine.status.snapshot(engine.status.node("node1"))
    listed = {g.index: g for g in snap.gpus}
    assert {0, 1, 3} <= set(listed) and listed[1].memory_used_mib == 2000
    assert any("is lost" in n for n in snap.notes)
    if style == "bus":  # no index said: the node notes it by bus id
        assert 2 not in listed and snap.lost == ("0000:3A:00.0",)
    else:
        assert listed[2].flags == ("lost",) and listed[2].memory_used_mib is None

    text = cli_status(fleet, "node1")
    assert text.returncode == 0, text.stderr
    assert "is lost" in text.stdout and "2000" in text.stdout
    doc = json.loads(cli_status(fleet, "node1", "--json").stdout)
    (n,) = doc.get("nodes", [doc])
    assert any("is lost" in note for note in n["notes"])

    kinds = await sweep_kinds(settings, store, engine)
    assert (f"{GPU_LOST}:{None if style == 'bus' else 2}") in kinds

    plan, before = await engine.plan(ResetRequest("node1", "root", gpus=(1,)))
    r = await engine.execute(plan, Ask.by("t", "t", "t"), before=before)
    assert [g.outcome for g in r.gpus] == [Outcome.FREED] and not alive(job.pid)

    r = await engine.gpu_reset("node1", 3, Ask.by("t", "t", "t"))
    assert [g.outcome for g in r.gpus] == [Outcome.FREED]


async def test_an_inforom_warning_keeps_the_data_and_flags_the_gpu(
    engine: ResetService, store: Store, settings: Settings, fleet: SimFleet, node: SimNode
) -> None:
    job = node.spawn(gpu=0, mib=1500)
    node.set_fault("inforom")
    snap = await engine.status.snapshot(engine.status.node("node1"))
    assert snap.gpus[0].memory_used_mib == 1500 and "warning" in snap.gpus[0].flags
    assert [n for n in snap.notes if "infoROM is corrupted" in n]
    text, doc = status_notes(fleet.config_path, "node1")
    assert "warning" in text and "warning" in doc["gpus"][0]["flags"]
    assert [n for n in doc["notes"] if "infoROM is corrupted" in n]
    assert await sweep_kinds(settings, store, engine) == set()  # a warning is not an incident
    plan, before = await engine.plan(ResetRequest("node1", "root", gpus=(0,)))
    r = await engine.execute(plan, Ask.by("t", "t", "t"), before=before)
    assert [g.outcome for g in r.gpus] == [Outcome.FREED], r.gpus
    assert not alive(job.pid)
    r = await engine.gpu_reset("node1", 0, Ask.by("t", "t", "t"))
    assert [g.outcome for g in r.gpus] == [Outcome.FREED]


@pytest.mark.parametrize(
    ("text", "flag"),
    [
        ("[GPU requires reset]", "requires-reset"),
        ("[GPU is lost]", "lost"),
        ("[Unknown Error]", "unknown-error"),
        ("[No data]", "no-data"),
        ("[Timeout]", "timeout"),
    ],
)
async def test_a_bracketed_value_is_unknown_and_flagged_not_a_node_failure(
    engine: ResetService,
    store: Store,
    settings: Settings,
    fleet: SimFleet,
    node: SimNode,
    text: str,
    flag: str,
) -> None:
    node.override("gpu", "memory.used", text, gpu=3)
    job = node.spawn(gpu=1, mib=700)
    snap = await engine.status.snapshot(engine.status.node("node1"))
    g3 = snap.gpu(3)
    assert g3 is not None and g3.memory_used_mib is None and flag in g3.flags
    assert snap.gpu(1) is not None and snap.gpu(1).memory_used_mib == 700  # type: ignore[union-attr]
    text, doc = status_notes(fleet.config_path, "node1")
    assert flag in text and flag in doc["gpus"][3]["flags"]
    assert doc["gpus"][3]["memory_used_mib"] is None
    lost = {f"{GPU_LOST}:3"} if flag == "lost" else set()
    assert await sweep_kinds(settings, store, engine) == lost  # unknown is never orphaned
    plan, before = await engine.plan(ResetRequest("node1", "root", gpus=(1,)))
    r = await engine.execute(plan, Ask.by("t", "t", "t"), before=before)
    assert [g.outcome for g in r.gpus] == [Outcome.FREED] and not alive(job.pid)
    r = await engine.gpu_reset("node1", 3, Ask.by("t", "t", "t"))
    (g,) = r.gpus  # its memory stays unknown: never called freed
    assert g.outcome is Outcome.UNKNOWN


async def test_a_stuck_nvidia_smi_is_reported_and_no_new_one_started(
    settings: Settings, store: Store, fleet: SimFleet, node: SimNode, tmp_path: Path
) -> None:
    # A 4 s command timeout: each nvidia-smi query gets 1 s; an own copy older than 4 s is stuck.
    ssh = dataclasses.replace(settings.ssh, command_timeout_s=4.0)
    short = dataclasses.replace(settings, ssh=ssh)
    transport = make_transport(short.ssh)
    engine = ResetService(
        short, transport, store, StatusService(short, transport, store), NodeLocks()
    )
    conf = tmp_path / "gpubot.toml"
    conf.write_text(
        fleet.config_path.read_text().replace("[ssh]\n", "[ssh]\ncommand_timeout_s = 4\n")
    )
    try:
        node.set_fault("stuck", hold_s=60)
        # nvidia-smi hangs (or, on a loaded box, the whole probe runs past the 4 s first)
        with pytest.raises((SmiFailed, CommandTimeout)):
            await engine.status.snapshot(engine.status.node("node1"))
        assert len(node.stuck_smi()) == 1  # the kill did not reach it
        await asyncio.sleep(5)
        with pytest.raises(SmiFailed, match=r"driver hung: nvidia-smi pid \d+ stuck for \d+s"):
            await engine.status.snapshot(engine.status.node("node1"))
        assert len(node.stuck_smi()) == 1 and node.hung_smi() == []  # no new query started
        env = {k: v for k, v in os.environ.items() if k != "GPUBOT_CONFIG"}
        for args in ((), ("--json",)):
            p = subprocess.run(
                [sys.executable, "-m", "gpubot", "--config", str(conf), "status", "node1", *args],
                capture_output=True,
                text=True,
                env=env,
                timeout=120,
            )
            assert p.returncode != 0 and "driver hung" in p.stdout + p.stderr
        sweep = SweepService(
            s := with_sweep(short, interval_s=60),
            engine.status,
            engine.transport,
            sweep_ports(s, store),
            replica="test",
        )
        found = (await sweep.run()).findings
        assert [(f.kind, "driver hung" in f.summary) for f in found] == [(SMI_FAILED, True)]
        with pytest.raises(SmiFailed, match="driver hung"):
            await engine.plan(ResetRequest("node1", "root", gpus=(0,)))
        with pytest.raises(SmiFailed, match="driver hung"):
            await engine.gpu_reset("node1", 0, Ask.by("t", "t", "t"))
        assert len(node.stuck_smi()) == 1
    finally:
        node.set_fault(None)
        await transport.close()
    assert node.stuck_smi() == []


async def test_a_gpu_in_mig_mode(
    engine: ResetService, store: Store, settings: Settings, fleet: SimFleet, node: SimNode
) -> None:
    node.set_mig(2, True)
    try:
        # Two jobs on two instances of GPU 2: nvidia-smi lists them against the GPU.
        jobs = [node.spawn(gpu=2, mib=1000), node.spawn(gpu=2, mib=2000)]
        snap = await engine.status.snapshot(engine.status.node("node1"))
        assert "mig" in snap.gpus[2].flags and "mig" not in snap.gpus[1].flags
        assert "mig" in cli_status(fleet, "node1").stdout
        assert '"mig"' in cli_status(fleet, "node1", "--json").stdout
        assert await sweep_kinds(settings, store, engine) == set()
        with pytest.raises(ResetRefused, match="still has processes"):
            await engine.gpu_reset("node1", 2, Ask.by("t", "t", "t"))
        plan, before = await engine.plan(ResetRequest("node1", "root", gpus=(2,)))
        assert sorted(t.pid for t in plan.targets) == sorted(j.pid for j in jobs)
        r = await engine.execute(plan, Ask.by("t", "t", "t"), before=before)
        assert [g.outcome for g in r.gpus] == [Outcome.FREED]
        r = await engine.gpu_reset("node1", 2, Ask.by("t", "t", "t"))
        assert [g.outcome for g in r.gpus] == [Outcome.FREED]  # every instance idle now
    finally:
        node.set_mig(2, False)
