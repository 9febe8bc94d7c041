"""core/durations: the one duration grammar, its formatter, and every place that takes one."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpubot.app import build
from gpubot.cli.audit import parse_since
from gpubot.cli.common import duration_arg
from gpubot.cli.console import identity
from gpubot.cli.status import _every as status_every
from gpubot.config import parse as parse_settings
from gpubot.console.front import ConsoleFront
from gpubot.console.repl import answer
from gpubot.core import commands, durations
from gpubot.core.claims import commands as claim_commands
from gpubot.errors import UsageError

NOW = 1_750_000_000.0
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
CONSOLE = parse_settings(
    {"database": {"url": "memory://"}, "nodes": [{"name": "node3", "host": "127.0.0.1", "port": 9}]}
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("30m", 1800),
        ("12h", 43200),
        ("1h30m", 5400),
        ("1h 30m", 5400),
        (" 90m ", 5400),
        ("2d", 172800),
        ("14d", 14 * 86400),
        ("1d12h", 129600),
        ("1w", 604800),
        ("2w", 1209600),
        ("1w2d", 777600),
        ("1w2d3h4m5s", 604800 + 2 * 86400 + 3 * 3600 + 4 * 60 + 5),
        ("1.5h", 5400),
        ("0.5d", 43200),
        (".5d", 43200),
        ("1H30M", 5400),
        ("2D", 172800),
        ("3650d", 3650 * 86400),
    ],
)
def test_what_parses(text: str, seconds: float) -> None:
    assert durations.parse(text) == seconds


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("", "expected a duration like"),
        ("   ", "expected a duration like"),
        ("14", "got '14'"),
        ("h", "got 'h'"),
        ("4x", "got '4x'"),
        ("3y", "got '3y'"),
        ("14 days", "got '14 days'"),
        ("-1h", "got '-1h'"),
        ("+1h", "got '+1h'"),
        ("1e3s", "got '1e3s'"),
        ("1h30", "got '1h30'"),
        ("30m1h", "largest first"),
        ("1h1h", "each at most once"),
        ("1h,30m", "got '1h,30m'"),
        ("0m", "greater than zero, got '0m'"),
        ("0h0m", "greater than zero"),
        ("3651d", "at most ten years (3650d), got '3651d'"),
        ("99999999w", "at most ten years"),
        (14, "got 14"),
        (None, "got None"),
    ],
)
def test_what_is_refused_in_one_line(value: object, said: str) -> None:
    with pytest.raises(ValueError, match="expected a duration") as exc:
        durations.parse(value)  # type: ignore[arg-type]
    assert said in str(exc.value) and "\n" not in str(exc.value)


def test_zero_only_where_the_caller_allows_it() -> None:
    assert durations.parse("0s", positive=False) == 0.0
    with pytest.raises(durations.DurationError, match="greater than zero"):
        durations.parse("0s")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30", 30.0), ("2.5", 2.5), (" 0.3 ", 0.3), (".5", 0.5), ("5.", 5.0), ("1m30s", 90.0)],
)
def test_bare_seconds_where_a_place_always_took_a_number(text: str, seconds: float) -> None:
    assert durations.parse(text, bare=True) == seconds
    assert duration_arg(text) == seconds  # --watch, --expire-every
    if "m" not in text:
        with pytest.raises(durations.DurationError, match="expected a duration like"):
            durations.parse(text)  # elsewhere a number without a unit is a mistake


@pytest.mark.parametrize("text", ["0", "-5", "+5", "1e3", "5 5", "inf", "nan", "99999999999"])
def test_bare_seconds_are_a_plain_number_only(text: str) -> None:
    with pytest.raises(durations.DurationError, match="expected a duration"):
        durations.parse(text, bare=True)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (-5, "0s"),
        (45, "45s"),
        (45.4, "45s"),
        (90, "1m30s"),
        (1800, "30m"),
        (5400, "1h30m"),
        (183600, "2d3h"),
        (604800, "1w"),
        (777600, "1w2d"),
        (86405, "1d5s"),
        (float("nan"), "0s"),
    ],
)
def test_format(seconds: float, text: str) -> None:
    assert durations.format(seconds) == text


@given(st.integers(min_value=1, max_value=int(durations.MAX_S)))
def test_format_then_parse_is_the_same_duration(seconds: int) -> None:
    assert durations.parse(durations.format(seconds)) == seconds


@given(
    st.lists(st.integers(min_value=0, max_value=99), min_size=5, max_size=5),
    st.booleans(),
)
def test_any_parts_largest_first_add_up(counts: list[int], spaced: bool) -> None:
    parts = [f"{n}{u}" for n, u in zip(counts, durations.UNITS, strict=True) if n]
    text = (" " if spaced else "").join(parts)
    total = sum(n * size for n, size in zip(counts, durations.UNITS.values(), strict=True))
    if total == 0:
        with pytest.raises(ValueError, match="expected a duration"):
            durations.parse(text)
    else:
        assert durations.parse(text) == total


# --- every place that takes a duration accepts 1h30m --------------------------------------------


def test_settings_take_1h30m() -> None:
    s = parse_settings(
        {"audit": {"seal_every": "1h30m", "max_seal_age": "2h"}, "idle": {"post_after": "1h30m"}}
    )
    assert (s.audit.seal_every_s, s.ladder.post_after_s) == (5400.0, 5400.0)


def test_claim_commands_take_1h30m() -> None:
    claim = commands.parse("claim node3 gpu 2 for 1h30m train")
    assert isinstance(claim, claim_commands.ClaimGpus) and claim.duration_s == 5400.0
    extend = commands.parse("extend node3 by 1h30m")
    assert isinstance(extend, claim_commands.Extend) and extend.by_s == 5400.0
    wait = commands.parse("wait node3 any 2 for 1h30m")
    assert isinstance(wait, claim_commands.WaitFor) and wait.duration_s == 5400.0
    with pytest.raises(UsageError, match=r"^bad duration '4x': expected a duration like"):
        commands.parse("claim node3 gpu 2 for 4x")


def test_audit_list_since_takes_1h30m() -> None:
    now = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
    assert parse_since("1h30m", now) == now - timedelta(minutes=90)
    with pytest.raises(UsageError, match=r"^bad --since '0m': expected a duration greater than"):
        parse_since("0m", now)


def test_report_since_takes_1h30m() -> None:
    assert durations.when("1h30m", NOW, "--since") == NOW - 5400
    assert commands.parse("report 1h30m by team") == commands.Report("1h30m", "team")
    with pytest.raises(UsageError, match=r"^bad period '3y': expected a duration like"):
        commands.parse("report 3y")


@pytest.mark.parametrize(
    ("text", "at"),
    [
        ("2026-11-25Z", datetime(2026, 11, 25, tzinfo=UTC).timestamp()),
        ("2026-11-25T09:00Z", datetime(2026, 11, 25, 9, tzinfo=UTC).timestamp()),
        (".5d", NOW - 43200),
        ("1969-12-31", 0.0),  # before anything was recorded: everything
        ("0001-01-01", 0.0),
    ],
)
def test_since_takes_a_z_an_early_date_and_every_duration(text: str, at: float) -> None:
    assert durations.when(text, NOW, "--since") == at


def test_audit_list_since_an_early_date_lists_everything() -> None:
    now = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
    assert parse_since("1969-12-31", now) == parse_since("0001-01-01", now) == EPOCH
    with pytest.raises(UsageError, match=r"^bad --since '1969-13-01': expected a duration ago"):
        parse_since("1969-13-01", now)  # the control: what is no date is still refused


DURATION_LIKE = (
    r" ?(\.[0-9]{1,2}|[0-9]{1,3}(\.[0-9]?)?) ?[wdhmsWDx]( ?(\.[0-9]|[0-9]{1,2})[dhms])? ?"
)


@settings(max_examples=200)
@given(st.from_regex(DURATION_LIKE, fullmatch=True))
def test_since_reads_exactly_the_durations_parse_reads(text: str) -> None:
    try:
        seconds = durations.parse(text)
    except durations.DurationError:
        return
    assert durations.when(text, NOW, "--since") == max(NOW - seconds, 0.0)


async def test_the_chat_report_takes_every_period_the_command_takes() -> None:
    app = build(CONSOLE, {}, need_store=True, front=ConsoleFront())
    me = identity(app.flows.svc.policy, None)
    try:
        for period in (".5d", "1h30m"):
            text = await answer(app.flows, f"/gpu report {period}", me)
            assert text.startswith("== GPU-hours by user") and "bad" not in text, text
        bad = await answer(app.flows, "/gpu report .5x", me)  # the control: refused, no flag
        assert bad.startswith("⚠ bad period '.5x'") and "--since" not in bad, bad
    finally:
        await app.close()


def test_grace_and_watch_take_durations_and_plain_seconds() -> None:
    assert commands.parse_grace("1m30s") == commands.parse_grace("90") == 90.0
    with pytest.raises(UsageError, match=r"^bad grace '11m': expected a duration from 0s to 10m"):
        commands.parse_grace("11m")
    assert status_every("1m") == 60.0 and status_every("0.5") == 0.5
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected from 0\.1s to 1d, got '2d'"):
        status_every("2d")


@settings(max_examples=40)
@given(st.integers(min_value=1, max_value=int(durations.MAX_S)))
def test_one_text_means_one_time_in_a_flag_a_command_and_a_setting(seconds: int) -> None:
    """What gpubot shows reads back as the same time wherever it is typed."""
    text = durations.format(seconds)
    now = datetime(2030, 1, 1, tzinfo=UTC)
    flag = parse_since(text, now)
    claim = commands.parse(f"claim node3 gpu 2 for {text}")
    setting = parse_settings({"idle": {"post_after": text}}).ladder.post_after_s
    assert isinstance(claim, claim_commands.ClaimGpus)
    assert now - flag == timedelta(seconds=claim.duration_s) == timedelta(seconds=setting)
    assert setting == seconds and durations.when(text, NOW, "--since") == NOW - seconds


# --- the people's form, and a claim's time left --------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 s"),
        (45.9, "45 s"),
        (60, "1 min"),
        (14 * 60 + 59, "14 min"),
        (3600, "1 h"),
        (2 * 3600 + 5 * 60, "2 h 5 min"),
        (86400, "1 d"),
        (86400 + 60, "1 d"),
        (3 * 86400 + 4 * 3600 + 59, "3 d 4 h"),
        (30 * 86400, "30 d"),
        (-5, "0 s"),
        (float("nan"), "0 s"),
    ],
)
def test_the_people_form(seconds: float, text: str) -> None:
    assert durations.format(seconds, "people") == text


@given(st.floats(min_value=0, max_value=1e9, allow_nan=False))
def test_the_people_form_is_short(seconds: float) -> None:
    text = durations.format(seconds, "people")
    assert 3 <= len(text) <= 16 and text[0].isdigit()


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(45, "45s"), (12 * 60 + 30, "12m"), (3600, "1h"), (4 * 3600 + 5 * 60 + 7, "4h5m"), (-3, "0s")],
)
def test_a_claims_time_left_reads_back_as_a_duration(seconds: float, text: str) -> None:
    assert durations.format(seconds, "minutes") == text
    assert durations.parse(text, positive=False) <= max(0, seconds)
