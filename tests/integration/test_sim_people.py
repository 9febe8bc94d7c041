"""The simulated fleet's own people (``gpusim.people``): workloads run as uids only the fleet
names, and the nodes' ``getent`` and ``id`` name them, while the host has no such account."""

from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path

import pytest

from gpubot.config import load
from gpubot.services.status import StatusService
from gpubot.transport import make_transport
from gpusim.errors import SimUsageError
from gpusim.fleet import SimFleet

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="another uid needs root")


async def test_workloads_run_as_the_fleets_people(tmp_path: Path) -> None:
    with SimFleet(tmp_path / "f", nodes=1, gpus=2, people=("dana", "bob")) as sim:
        dana = sim.people["dana"]
        with pytest.raises(KeyError):
            pwd.getpwuid(dana.pw_uid)  # no account of this host
        w = sim.node("node1").spawn(gpu=0, mib=1024, user="dana")
        status = Path(f"/proc/{w.pid}/status").read_text()
        assert f"\nUid:\t{dana.pw_uid}\t{dana.pw_uid}\t" in status
        standin = sim.root / "people-bin"
        getent = subprocess.run(
            [str(standin / "getent"), "passwd", str(dana.pw_uid), "root"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert getent.stdout.splitlines()[0].startswith(f"dana:x:{dana.pw_uid}:")
        assert any(line.startswith("root:x:0:") for line in getent.stdout.splitlines())
        real = subprocess.run(["getent", "passwd", str(dana.pw_uid)], capture_output=True)
        assert real.returncode == 2  # the control: the host's own getent does not know her
        idn = subprocess.run([str(standin / "id"), "-nu", str(dana.pw_uid)], capture_output=True)
        assert idn.stdout.decode().strip() == "dana"
        # gpubot's own probe, over SSH, names her
        settings = load(sim.config_path)
        transport = make_transport(settings.ssh)
        try:
            snap = await StatusService(settings, transport, None).snapshot(settings.nodes[0])
        finally:
            await transport.close()
        (p,) = [p for p in snap.processes if p.pid == w.pid]
        assert (p.user, p.uid) == ("dana", dana.pw_uid)


@pytest.mark.parametrize("names", [("root",), ("dana", "dana"), ("Bad Name",)])
def test_people_are_new_well_formed_names(tmp_path: Path, names: tuple[str, ...]) -> None:
    with pytest.raises(SimUsageError, match="people: "):
        SimFleet(tmp_path / "f", nodes=1, gpus=1, people=names)
