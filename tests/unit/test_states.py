"""Finite states are StrEnums whose stored and JSON words never change; one ISO time helper."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from enum import StrEnum

import pytest

from gpubot.core.models import ActionStatus, ResetStep, StopResult
from gpubot.core.reset.signals import PidStatus
from gpubot.core.timefmt import iso
from gpubot.store.records import iso as stored_iso

WORDS = [
    (
        ActionStatus,
        ["freed", "not-freed", "error", "refused", "done", "unchanged", "incomplete", "unknown"],
    ),
    (
        ResetStep,
        [
            "planned",
            "signal",
            "exited",
            "verifying",
            "gpu_outcome",
            "persistence",
            "gpu_reset",
            "stop_workload",
            "sending",
            "node_log",
        ],
    ),
    (StopResult, ["not-run", "running", "done", "failed"]),
    (PidStatus, ["gone", "reused", "owner", "alive", "sent", "failed", "not-sent"]),
]


@pytest.mark.parametrize(("enum", "words"), WORDS, ids=lambda e: getattr(e, "__name__", ""))
def test_the_stored_words_stay(enum: type[StrEnum], words: list[str]) -> None:
    assert [m.value for m in enum] == words
    for m in enum:
        assert json.dumps({"x": m}) == json.dumps({"x": m.value}) and f"{m}" == m.value == m


@pytest.mark.parametrize(
    ("t", "timespec", "text"),
    [
        (0.0, "seconds", "1970-01-01T00:00:00Z"),
        (1.5, "milliseconds", "1970-01-01T00:00:01.500Z"),
        (
            datetime(2026, 1, 2, 5, 4, 5, tzinfo=timezone(timedelta(hours=3))),
            "seconds",
            "2026-01-02T02:04:05Z",
        ),
        (datetime(5, 1, 2, 3, 4, 5, 6, tzinfo=UTC), "microseconds", "0005-01-02T03:04:05.000006Z"),
    ],
)
def test_iso_is_utc_and_ends_in_z(t: datetime | float, timespec: str, text: str) -> None:
    assert iso(t, timespec=timespec) == text


def test_the_store_text_is_iso_in_microseconds() -> None:
    moment = datetime(2026, 3, 4, 5, 6, 7, 89, tzinfo=UTC)
    text = "2026-03-04T05:06:07.000089Z"
    assert stored_iso(moment) == iso(moment, timespec="microseconds") == text
    with pytest.raises(ValueError, match="naive"):
        stored_iso(datetime(2026, 3, 4))
