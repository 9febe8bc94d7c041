"""Outcome classification: a GPU is freed only when verification says so."""

from __future__ import annotations

import pytest

from gpubot.core.models import Outcome
from gpubot.core.reset.outcome import GpuObservation, GpuResult, Kept, Newcomer, Survivor, classify

SURV = (Survivor(42, "D", "nv_wait"),)
NEW = (Newcomer(77, "bob", "python3 train.py", 70, "supervisor.sh", "/system.slice/train.service"),)
KEPT = (Kept(14, "root", "/usr/bin/nvidia-persistenced --verbose", 500),)
REFUSED = ("pid 12: its owner is now uid 1001, not the planned owner; not signalled",)


@pytest.mark.parametrize(
    ("obs", "outcome", "words"),
    [
        (GpuObservation(0, 100, True), Outcome.FREED, "100 MiB"),
        (
            GpuObservation(0, 90000, False, survivors=SURV),
            Outcome.STUCK,
            "state D, waiting in nv_wait",
        ),
        (GpuObservation(0, 100, True, newcomers=NEW), Outcome.RESPAWNED, "train.service"),
        (GpuObservation(0, 80000, False, holders=0), Outcome.ORPHANED, "--gpu-reset -i 0"),
        (GpuObservation(0, 80000, False, holders=1), Outcome.UNKNOWN, "expected <= 256"),
        (GpuObservation(0, None, False, error="nvidia-smi hung"), Outcome.UNKNOWN, "hung"),
        (GpuObservation(0, None, False), Outcome.UNKNOWN, "no answer"),
        # a protected daemon left alone that still holds memory: not free, and says whose
        (
            GpuObservation(0, 500, True, kept=KEPT),
            Outcome.STUCK,
            "pid 14 (/usr/bin/nvidia-persistenced --verbose, root) is a protected system daemon, "
            "left alone, and still holds 500 MiB",
        ),
        (
            GpuObservation(0, 500, False, holders=0, kept=KEPT),
            Outcome.STUCK,
            "stop that service by hand",
        ),
        (
            GpuObservation(0, 500, True, kept=(Kept(9, None, "Xorg", 64), *KEPT)),
            Outcome.STUCK,
            "pid 9 (Xorg, ?) is a protected system daemon",
        ),
        # survivors and newcomers come first: they are what a person must deal with
        (
            GpuObservation(0, 9000, False, survivors=SURV, kept=KEPT),
            Outcome.STUCK,
            "pid 42 survived SIGKILL",
        ),
        (
            GpuObservation(0, 9000, False, newcomers=NEW, kept=KEPT),
            Outcome.RESPAWNED,
            "pid 77 (python3 train.py) took the GPU again",
        ),
        (
            GpuObservation(0, 9000, False, survivors=SURV, newcomers=NEW),
            Outcome.STUCK,
            "pid 42 survived SIGKILL",
        ),
        # a planned process the node refused to signal: never freed, never orphaned
        (
            GpuObservation(0, 80000, False, not_signalled=REFUSED),
            Outcome.UNKNOWN,
            f"not verified free: {REFUSED[0]}",
        ),
        (
            GpuObservation(0, 80000, False, holders=0, not_signalled=REFUSED),
            Outcome.UNKNOWN,
            f"not verified free: {REFUSED[0]}",
        ),
        (
            GpuObservation(0, None, False, error="nvidia-smi hung", not_signalled=REFUSED),
            Outcome.UNKNOWN,
            f"not verified free: {REFUSED[0]}",
        ),
        (
            GpuObservation(0, 80000, False, not_signalled=(*REFUSED, "pid 13: kill failed")),
            Outcome.UNKNOWN,
            "pid 12: its owner is now uid 1001",
        ),
        (GpuObservation(0, 100, True, not_signalled=REFUSED), Outcome.FREED, "memory at 100 MiB"),
        (
            GpuObservation(0, 80000, False, kept=KEPT, not_signalled=REFUSED),
            Outcome.STUCK,
            "protected system daemon",
        ),
    ],
)
def test_classify(obs: GpuObservation, outcome: Outcome, words: str) -> None:
    got, detail = classify(obs, 0, 256)
    assert got is outcome
    assert words in detail
    assert "\n" not in detail


def test_freed_only_when_verified() -> None:
    """Whatever else is seen, FREED needs verification, and verification alone is not enough."""
    extras = [
        {},
        {"kept": KEPT},
        {"not_signalled": REFUSED},
        {"survivors": SURV},
        {"newcomers": NEW},
        {"holders": 0},
        {"error": "x"},
    ]
    for verified in (False, True):
        for mem in (None, 0, 100, 90000):
            for extra in extras:
                obs = GpuObservation(0, mem, verified, **extra)  # type: ignore[arg-type]
                got, _ = classify(obs, 0, 256)
                if got is Outcome.FREED:
                    assert verified and not (obs.kept or obs.survivors or obs.newcomers), obs


def test_result_to_dict() -> None:
    r = GpuResult(0, Outcome.STUCK, "pid 14 ...", 600, 500, None)
    assert r.to_dict() == {
        "index": 0,
        "outcome": "stuck",
        "detail": "pid 14 ...",
        "memory_before_mib": 600,
        "memory_after_mib": 500,
        "seconds_to_free": None,
    }


def test_memory_left_by_untouched_processes_is_expected() -> None:
    assert classify(GpuObservation(3, 5000, False, holders=0), 4900, 256)[0] is Outcome.UNKNOWN
    assert classify(GpuObservation(3, 5300, False, holders=0), 4900, 256)[0] is Outcome.ORPHANED
