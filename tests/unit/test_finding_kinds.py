"""The list of finding kinds (``core.health.kinds``): each kind a value beside its check."""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

import pytest

from gpubot.core.alerting import confirmed, to_resolve
from gpubot.core.findings import FindingKey, FindingKind, NodeFailure
from gpubot.core.health.kinds import BY_NAME, KINDS, _check, title_of

NOW = datetime(2026, 5, 1, tzinfo=UTC)

# What the database and alert keys hold, and what each alert says: never to change.
STORED = {
    "orphaned-vram": "orphaned GPU memory",
    "zombie-process": "zombie process",
    "hidden-holder": "hidden GPU holder",
    "idle-holder": "idle GPU holder",
    "node-unreachable": "node unreachable",
    "node-slow": "node too slow to answer",
    "smi-failed": "nvidia-smi failed",
    "gpu-lost": "GPU lost",
    "memory-repair-pending": "GPU memory repair pending",
    "remap-failed": "GPU row remapping failed",
    "ecc-uncorrected": "uncorrectable ECC errors growing",
    "fabric-not-ready": "GPU fabric not ready",
    "nvlink-down": "NVLink link down",
    "gpu-throttled": "GPU throttled",
    "gpu-xid": "Xid error",
    "nvswitch-sxid": "NVSwitch SXid error",
    "claim-intruder": "unclaimed use of a claimed GPU",
    "slurm-allocated-unused": "GPU allocated by Slurm, unused",
    "slurm-outside": "GPU used outside Slurm",
    "slurm-node-drained": "node drained in Slurm",
    "ecc-since-load": "uncorrectable ECC errors since the driver loaded",
    "gpu-vanished": "GPU vanished",
    "hung-busy": "GPU busy without progress",
}


def test_every_stored_name_and_title_is_kept() -> None:
    assert {k.value: k.heading for k in KINDS} == STORED
    assert [k.value for k in KINDS] == list(STORED)  # the metrics' label order
    assert str(BY_NAME["gpu-xid"]) == "gpu-xid" and title_of("gpu-xid") == "Xid error"
    assert title_of("hoarding") == "hoarding"  # a name no longer listed reads as itself


def test_what_each_kind_offers() -> None:
    def names(flag: str) -> set[str]:
        return {k.value for k in KINDS if getattr(k, flag)}

    gpu = {"orphaned-vram", "memory-repair-pending", "fabric-not-ready", "nvlink-down"}
    gpu |= {"ecc-since-load"}  # a GPU reset clears the volatile count (and applies a remap)
    holders = {"zombie-process", "hidden-holder", "idle-holder", "slurm-outside"}
    assert names("reset") == gpu | holders
    assert names("gpu_reset") == gpu
    assert names("ladder") == {"idle-holder", "hung-busy"}
    assert names("event") == {"gpu-xid", "nvswitch-sxid"}
    assert names("node") == {"node-unreachable", "node-slow", "smi-failed"}


@dataclass(frozen=True)
class Seen:
    """An alert state: seen once, nothing else yet."""

    first_seen: datetime = NOW
    seen_count: int = 1
    alerted_at: datetime | None = None
    reminded_at: datetime | None = None
    snoozed_until: datetime | None = None
    resolved_at: datetime | None = None


def test_alerting_reads_the_kinds_by_their_stored_names() -> None:
    assert confirmed("gpu-xid", Seen()) and confirmed(BY_NAME["gpu-xid"], Seen())
    assert not confirmed("orphaned-vram", Seen())
    assert confirmed("orphaned-vram", Seen(seen_count=2))
    node, gpu = FindingKey("n", None, "node-slow"), FindingKey("n", 0, "orphaned-vram")
    cleared = to_resolve([node, gpu], [], answered=[], failed=["n"], configured=["n"])
    assert cleared == [node]  # a failed node clears its node finding, not its GPUs'


def test_the_list_refuses_two_kinds_under_one_name() -> None:
    _check(KINDS)
    twin = FindingKind("orphaned-vram", "another title")
    with pytest.raises(ValueError, match="name given twice: orphaned-vram"):
        _check((*KINDS, twin))


def test_a_kind_is_its_stored_name_wherever_it_goes() -> None:
    slow = BY_NAME["node-slow"]
    assert slow == "node-slow" and slow.value == "node-slow" and type(slow.value) is str
    assert (
        json.dumps(asdict(NodeFailure(slow, "late"))) == '{"kind": "node-slow", "reason": "late"}'
    )
    assert copy.deepcopy(slow) is slow and copy.copy(slow) is slow
    with pytest.raises(AttributeError, match="fixed"):
        slow.heading = "another title"
