"""Outcome classification: a GPU is freed only when verification says so."""

from __future__ import annotations

import pytest

from gpubot.core.models import Outcome
from gpubot.core.outcome import GpuObservation, Newcomer, Survivor, classify

SURV = (Survivor(42, "D", "nv_wait"),)
NEW = (Newcomer(77, "bob", "python3 train.py", 70, "supervisor.sh", "/system.slice/train.service"),)


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
    ],
)
def test_classify(obs: GpuObservation, outcome: Outcome, words: str) -> None:
    got, detail = classify(obs, 0, 256)
    assert got is outcome
    assert words in detail


def test_memory_left_by_untouched_processes_is_expected() -> None:
    assert classify(GpuObservation(3, 5000, False, holders=0), 4900, 256)[0] is Outcome.UNKNOWN
    assert classify(GpuObservation(3, 5300, False, holders=0), 4900, 256)[0] is Outcome.ORPHANED
