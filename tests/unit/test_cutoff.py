"""What an interrupted reset had sent (``core.reset.cutoff``) and the holder's lease
(``core.lease``): tables of cases, no I/O."""

from __future__ import annotations

from typing import Any

import pytest

from gpubot.core.lease import Lease, lost_message
from gpubot.core.models import Outcome
from gpubot.core.reset.cutoff import interrupted_message, sent_items, unknown_gpus
from gpubot.errors import LeaseLost

T0 = "2026-12-01T12:00:01.250Z"
T1 = "2026-12-01T12:00:03.500Z"
T2 = "2026-12-01T12:00:05.000Z"


def _sig(pid: int, sig: str, result: str = "sent", at: str = T0) -> dict[str, Any]:
    return {"kind": "signal", "pid": pid, "signal": sig, "result": result, "at": at}


@pytest.mark.parametrize(
    ("steps", "alive_at", "expected"),
    [
        ([], {}, []),
        ([_sig(7, "SIGTERM")], {}, ["SIGTERM to pid 7 at 12:00:01Z (not known since)"]),
        (
            [_sig(7, "SIGTERM"), {"kind": "exited", "pid": 7, "at": T1}],
            {},
            ["SIGTERM to pid 7 at 12:00:01Z (exited by 12:00:03Z)"],
        ),
        (
            [_sig(7, "SIGTERM")],
            {7: T2},
            ["SIGTERM to pid 7 at 12:00:01Z (still alive at 12:00:05Z, not known since)"],
        ),
        ([_sig(7, "SIGTERM", at=T2)], {7: T1}, ["SIGTERM to pid 7 at 12:00:05Z (not known since)"]),
        # Refused or gone targets got nothing: they are not "sent".
        ([_sig(7, "SIGTERM", "gone"), _sig(8, "SIGTERM", "not-sent")], {}, []),
        (
            [{"kind": "stop_workload", "result": "running", "command": "docker stop x", "at": T0}],
            {},
            ["docker stop x at 12:00:01Z (its end was not recorded)"],
        ),
        (
            [{"kind": "gpu_reset", "exit_status": 0, "at": T0}],
            {},
            ["nvidia-smi --gpu-reset at 12:00:01Z (exit status 0)"],
        ),
    ],
)
def test_sent_items(
    steps: list[dict[str, Any]], alive_at: dict[int, str], expected: list[str]
) -> None:
    assert [s.text() for s in sent_items(steps, alive_at)] == expected


def test_the_message_names_what_went_out_and_each_gpu_unknown() -> None:
    sent = sent_items([_sig(p, "SIGTERM") for p in range(1, 9)], {})
    msg = interrupted_message("node3", "node3: connection lost", sent, (0, 2))
    assert msg.startswith("node3: connection lost; already sent on node3: SIGTERM to pid 1 at ")
    assert "SIGTERM to pid 6 at" in msg and "pid 7" not in msg and "; and 2 more;" in msg
    assert msg.endswith("GPU 0, 2: unknown, check with `gpubot status node3`")
    assert "\n" not in msg
    assert interrupted_message("node3", "boom", [], (0,)) == "boom"  # nothing sent: as it was


def test_unknown_gpus() -> None:
    (g,) = unknown_gpus((1,), "lost the node lease")
    assert (g.index, g.outcome, g.memory_before_mib, g.memory_after_mib) == (
        1,
        Outcome.UNKNOWN,
        None,
        None,
    )
    assert g.detail.startswith("lost the node lease: the reset stopped before verifying")


@pytest.mark.parametrize(
    ("resource", "said"),
    [
        ("reset:node3", "lost the node lease: another gpubot may be acting on node3"),
        ("sweep", "lost the sweep lease: another gpubot may be doing this work"),
    ],
)
def test_lost_message(resource: str, said: str) -> None:
    assert lost_message(resource) == said


def test_a_lease_is_lost_once_known_gone_or_past_its_expiry() -> None:
    lease = Lease("reset:node3", "A", 4, expires_at=100.0, ttl_s=30)
    lease.check(99.0)  # held
    assert lease.fence is not None and lease.fence.token == 4
    with pytest.raises(LeaseLost, match=r"another gpubot may be acting on node3 \(it expired"):
        lease.check(100.0)
    lease.mark_lost("later reason")
    assert lease.lost is not None and lease.lost.startswith("it expired")  # the first stays
    local = Lease("reset:node3", "A", 1, expires_at=0.0, shared=False)
    local.check(1e12)  # an in-process lease never expires
    assert local.fence is None  # and has no row to fence on
