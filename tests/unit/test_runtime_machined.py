"""systemd-machined machines (core/runtimes/machined.py): nspawn containers and libvirt VMs.

The runtime was added as one module; these tests and three corpus samples (tests/corpus/,
sources in index.json) are all it needed besides.
"""

from __future__ import annotations

import pytest

from gpubot.core import workload
from gpubot.core.enrich import enrich_target
from gpubot.core.reset.stopgate import noun, workload_root
from gpubot.core.workload import (
    decide_owner,
    describe,
    may_restart,
    parse_cgroup,
    short_name,
    stop_argv,
    stop_command,
)
from tests.fixtures.node_samples import CID, v2

QEMU = r"/machine.slice/machine-qemu\x2d18\x2dDroplet\x2d7572850.scope"  # lore.kernel.org, 2021


@pytest.mark.parametrize(
    ("path", "wid", "name", "unit"),
    [
        (f"{QEMU}/emulator", r"qemu\x2d18\x2dDroplet\x2d7572850", "qemu-18-Droplet-7572850", None),
        ("/machine.slice/systemd-nspawn@delphix.uE0noy5.service", "delphix.uE0noy5", None, None),
        ("/machine.slice/systemd-nspawn@jammy.service/payload/init.scope", "jammy", None, None),
        (
            "/machine.slice/systemd-nspawn@jammy.service/payload/system.slice/cron.service",
            "jammy",
            None,
            "systemd-nspawn@jammy.service",
        ),
        ("/machine.slice/systemd-nspawn@jammy.service/supervisor", "jammy", None, None),
        ("/machine.slice/machine-web01.scope/payload", "web01", None, "machine-web01.scope"),
    ],
)
def test_a_machine_is_named_stopped_and_roots(
    path: str, wid: str, name: str | None, unit: str | None
) -> None:
    w = parse_cgroup(v2(path))
    assert w is not None and (w.kind, w.id) == ("machine", wid)
    assert w.name == (name or wid)
    if unit is not None:
        assert w.get("unit") == unit
    owned = decide_owner(w, {0: "root", 1000: "alice"}, "owner")
    assert owned.owner == "root"  # only root makes cgroups in machine.slice
    assert stop_command(owned) == f"machinectl terminate {w.name}"
    assert may_restart(owned)  # a booted container's init starts its services again
    assert enrich_target(owned) is None  # no lookup: the name is in the path
    assert short_name(owned) == f"machine:{w.name}"
    assert describe(owned) == (
        f"machine `{w.name}` (a systemd-machined container or VM) of Linux user `root`"
    )


def test_the_owner_label_names_a_machines_owner() -> None:
    w = parse_cgroup(v2("/machine.slice/machine-web01.scope"))
    assert w is not None
    labelled = w.with_detail(**{"label.owner": "alice"})
    assert decide_owner(labelled, {}, "owner").owner == "alice"
    assert decide_owner(labelled, {}, None).owner == "root"


def test_the_stop_gate_checks_the_whole_machine() -> None:
    w = parse_cgroup(v2("/machine.slice/systemd-nspawn@jammy.service/payload/init.scope"))
    assert w is not None
    path = "/machine.slice/systemd-nspawn@jammy.service/payload/system.slice/x.service"
    assert workload_root(path, w) == "/machine.slice/systemd-nspawn@jammy.service"
    assert noun(w, stop_argv(w) or []) == "machine `jammy`"


@pytest.mark.parametrize(
    "path",
    [
        r"/machine.slice/machine-a\x20b.scope",  # a space: no plain host name
        r"/machine.slice/machine-a\x2fb.scope",  # a slash
        r"/machine.slice/machine-\x2drf.scope",  # "-rf": would be an option
    ],
)
def test_a_name_that_is_no_plain_host_name_gets_no_stop(path: str) -> None:
    w = parse_cgroup(v2(path))
    assert w is not None and w.kind == "machine"
    assert w.name is None and stop_command(w) is None
    assert describe(w).startswith(f"machine `{w.id}`")


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        # An unprivileged user's machine is in their own manager: theirs (systemd issue 37938).
        (
            "/user.slice/user-1000.slice/user@1000.service/machine.slice/android-build.scope",
            "session",
        ),
        ("/system.slice/machine-web01.scope", "other"),  # not machine.slice: no machine
        ("/machine.slice/machine-web01.service", "other"),
        ("/system.slice/systemd-machined.service", "other"),  # machined itself
    ],
)
def test_lookalikes_are_no_machine(path: str, kind: str) -> None:
    w = parse_cgroup(v2(path))
    assert w is not None and w.kind == kind
    assert decide_owner(w, {0: "root", 1000: "alice"}, "owner").owner is None
    assert stop_command(w) is None or kind == "session"


def test_a_container_inside_a_machine_is_tied_to_the_machine() -> None:
    w = parse_cgroup(
        v2(f"/machine.slice/systemd-nspawn@ci.service/payload/system.slice/docker-{CID}.scope")
    )
    assert w is not None and (w.kind, w.id) == ("docker", f"ci/{CID}")
    assert w.get("outer_kind") == "machine"
    assert stop_command(w) is None and enrich_target(w) is None  # the host's docker knows none
    assert decide_owner(w, {}, "owner").owner == "root"


def test_control_without_the_module_a_machine_is_other() -> None:
    """Control: the registry is what knows machines; without machined's shapes a QEMU VM's
    scope is a cgroup of no known shape, with no stop command."""
    without = tuple(s for s in workload.SHAPES if s[0] != "machine")
    assert len(without) == len(workload.SHAPES) - 2
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("gpubot.core.workload.SHAPES", without)
        w = parse_cgroup(v2(f"{QEMU}/emulator"))
    assert w is not None and w.kind == "other"
    assert w.get("reason") == "no known workload shape" and stop_command(w) is None
