"""A rootless container that copies a root container's id is never taken for it.

A user names the cgroups of their own subtree as they like, so a rootless container's
``docker-ID.scope`` can carry the id of a root container on the same box. Names, owners and
"every process of this workload" are looked up by a workload's key; if the key were only kind and
id, the user's process would be merged into the root container (and take its owner label), or the
root container's processes into the user's.
"""

from __future__ import annotations

import pytest

from gpubot.core.enrich import attribute
from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.workload import Workload, parse_cgroup

CID = "ab" * 32
ROOT_CG = f"0::/system.slice/docker-{CID}.scope\n"
FAKE_CG = f"0::/user.slice/user-1002.slice/user@1002.service/app.slice/docker-{CID}.scope\n"


def _proc(pid: int, uid: int, user: str, cgroup: str) -> GpuProcess:
    return GpuProcess(
        pid=pid,
        gpu_index=0,
        used_memory_mib=1024,
        process_name="python3",
        visible_to_nvidia_smi=True,
        holds_device_file=True,
        user=user,
        uid=uid,
        workload=parse_cgroup(cgroup),
    )


def _snap() -> NodeSnapshot:
    gpu = GpuInfo(
        index=0,
        uuid="GPU-0",
        name="sim",
        memory_total_mib=81920,
        memory_used_mib=2048,
        utilization_pct=0,
    )
    return NodeSnapshot(
        node="n1",
        taken_at=0.0,
        gpus=(gpu,),
        processes=(_proc(10, 0, "root", ROOT_CG), _proc(11, 1002, "mallory", FAKE_CG)),
    )


def _named_root(snap: NodeSnapshot) -> Workload:
    root = snap.processes[0].workload
    assert root is not None
    return root.with_detail(**{"label.owner": "alice"})


def test_the_keys_differ() -> None:
    snap = _snap()
    root, fake = (p.workload for p in snap.processes)
    assert root is not None and fake is not None
    assert (root.kind, root.id) == (fake.kind, fake.id)  # what the user can copy
    assert root.key != fake.key


def test_the_lookalike_keeps_its_own_user_and_the_container_its_label() -> None:
    snap = _snap()
    named = {_named_root(snap).key: _named_root(snap)}
    out = attribute(snap, "owner", named)
    root, fake = (p.workload for p in out.processes)
    assert root is not None and root.owner == "alice"
    assert fake is not None and fake.owner == "mallory" and fake.get("rootless") == "yes"
    assert fake.get("label.owner") is None


def test_control_keyed_by_kind_and_id_the_lookalike_takes_the_container(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the uid in the key, the user's process becomes alice's container's."""
    monkeypatch.setattr(Workload, "key", property(lambda w: (str(w.kind), w.id, "")))
    snap = _snap()
    named = {_named_root(snap).key: _named_root(snap)}
    fake = attribute(snap, "owner", named).processes[1].workload
    assert fake is not None and fake.owner == "alice"  # mallory's process, alice's to kill
