"""The pure rules of GPU-hours and the reclaim ladder: windows, the digest's time, the chat
command, the settings' one-line errors, the ladder's next step and a sample's weight."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpubot.config import parse
from gpubot.core import commands, durations
from gpubot.core.usage.hours import shares, weight_ms
from gpubot.core.usage.ladder import LadderRule, Rung, Step, keep_reason, next_step
from gpubot.core.usage.report import Digest, Window
from gpubot.errors import ConfigError, UsageError

NOW = datetime(2026, 12, 2, 10, 30, tzinfo=UTC).timestamp()  # a Wednesday


@pytest.mark.parametrize(
    ("text", "ago"),
    [("7d", 7 * 86400), ("12h", 43200), ("1d12h", 129600), ("2w", 14 * 86400)],
)
def test_a_duration_is_that_long_ago(text: str, ago: float) -> None:
    assert durations.when(text, NOW, "--since") == NOW - ago


def test_a_date_is_utc_and_windows_are_whole_hours() -> None:
    assert (
        durations.when("2026-11-25", NOW, "--since")
        == datetime(2026, 11, 25, tzinfo=UTC).timestamp()
    )
    w = Window.of("2026-11-30T08:15", "2026-11-30T09:05", NOW)
    assert (w.since, w.until) == (
        datetime(2026, 11, 30, 8, tzinfo=UTC).timestamp(),
        datetime(2026, 11, 30, 10, tzinfo=UTC).timestamp(),
    )
    assert w.text() == "2026-11-30 08:00 to 2026-11-30 10:00 UTC"


def test_a_window_from_before_1970_is_everything_since() -> None:
    w = Window.of("0001-01-01", None, NOW)
    assert (w.since, w.text()[:16]) == (0, "1970-01-01 00:00")


@pytest.mark.parametrize(
    ("since", "until", "said"),
    [
        ("last week", None, "bad --since 'last week'"),
        ("0d", None, "bad --since '0d'"),
        ("1d", "soon", "bad --until 'soon'"),
        ("2026-12-03", None, "must be before --until"),
        ("9999999d", None, "bad --since '9999999d': expected a duration of at most ten years"),
        ("1d", "1969-12-31", r"must be before --until \(1970-01-01 00:00\)"),
    ],
)
def test_a_bad_window_is_one_line(since: str, until: str | None, said: str) -> None:
    with pytest.raises(ValueError, match=said) as err:
        Window.of(since, until, NOW)
    assert "\n" not in str(err.value)


def test_the_digest_is_due_at_its_weekday_and_time() -> None:
    d = Digest.parse("Mon 09:00")
    monday = datetime(2026, 11, 30, 9, tzinfo=UTC).timestamp()
    assert d.last_due(NOW) == monday and d.period(NOW) == "digest:2026-11-30"
    assert d.last_due(monday - 1) == monday - 7 * 86400  # a second early: last week's
    assert d.last_due(monday) == monday
    for bad in ("monday", "mon 9", "mon 24:00", "xyz 09:00", "mon 09:60"):
        with pytest.raises(ValueError, match="expected a weekday and a UTC time"):
            Digest.parse(bad)


@pytest.mark.parametrize(
    ("line", "want"),
    [
        ("report", commands.Report("7d", "user")),
        ("/gpu report 2w by team", commands.Report("2w", "team")),
        ("report by node", commands.Report("7d", "node")),
        ("REPORT 12H BY USER", commands.Report("12h", "user")),
    ],
)
def test_the_report_command(line: str, want: commands.Report) -> None:
    assert commands.parse(line) == want


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("report yesterday", "bad period 'yesterday'"),
        ("report 7d by gpu", "usage: /gpu report"),
        ("report 7d by", "usage: /gpu report"),
        ("report 7d by team now", "unexpected 'now' after 'report'"),
    ],
)
def test_a_bad_report_command_is_one_line(line: str, said: str) -> None:
    with pytest.raises(UsageError, match=said):
        commands.parse(line)


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (
            {"teams": {"ml": "alice"}},
            "teams.ml: expected a list of Linux users or a Slack user group",
        ),
        ({"teams": {"ml": ["Alice!"]}}, "teams.ml: bad Linux user name 'Alice!'"),
        ({"reports": {"digest": "someday"}}, "reports.digest: expected a weekday"),
        ({"reports": {"digest_by": "gpu"}}, "reports.digest_by: expected one of"),
        ({"idle": {"remind_after": "soon"}}, "idle.remind_after: expected a duration"),
        ({"idle": {"ladder": "yes"}}, "idle.ladder: expected true or false"),
        ({"idle": {"reclaim": True}}, "reclaim"),
    ],
)
def test_bad_settings_are_one_line(raw: dict[str, object], said: str) -> None:
    with pytest.raises(ConfigError, match=said) as err:
        parse(raw)
    assert "\n" not in str(err.value)


def test_the_settings_default_to_off() -> None:
    s = parse({})
    assert s.reports.digest is None and s.reports.teams == () and not s.ladder.enabled
    on = parse({"idle": {"ladder": True, "remind_after": "30m"}, "teams": {"nlp": "S0NLP"}})
    assert on.ladder == LadderRule(True, 1800.0, 7200.0, 3600.0)
    assert on.reports.team_groups == (("nlp", "S0NLP"),)


RULE = LadderRule(True, remind_after_s=100, post_after_s=200, offer_after_s=50)


def rung(step: Step, at: float, kept: bool = False) -> Rung:
    return Rung("k", "n1", 0, "alice", step, 0.0, at, kept_at=1.0 if kept else None)


@pytest.mark.parametrize(
    ("now", "r", "want"),
    [
        (0.0, None, Step.DM),
        (99.0, rung(Step.DM, 0.0), None),
        (100.0, rung(Step.DM, 0.0), Step.REMIND),
        (199.0, rung(Step.REMIND, 0.0), None),
        (200.0, rung(Step.REMIND, 0.0), Step.POST),
        (50.0, rung(Step.POST, 0.0), Step.OFFER),
        (1e9, rung(Step.OFFER, 0.0), None),  # the last step: never an automatic kill
        (1e9, rung(Step.DM, 0.0, kept=True), None),  # kept: the ladder stops
    ],
)
def test_the_next_step(now: float, r: Rung | None, want: Step | None) -> None:
    assert next_step(r, RULE, now) == want
    assert next_step(r, LadderRule(False), now) is None  # off: nothing ever


def test_a_keep_needs_a_reason() -> None:
    assert keep_reason("  eval   tonight ") == "eval tonight"
    assert len(keep_reason("x" * 1000)) == 300
    with pytest.raises(ValueError, match="a reason is required"):
        keep_reason("   ")


def test_a_sample_counts_the_time_since_the_one_before() -> None:
    assert weight_ms(None, 1000.0, 300.0) == 300_000  # the first: one interval
    assert weight_ms(700.0, 1000.0, 300.0) == 300_000
    assert weight_ms(400.0, 1000.0, 300.0) == 600_000  # two intervals: still counted
    assert weight_ms(399.0, 1000.0, 300.0) == 300_000  # longer: missing data, one interval
    assert weight_ms(1000.0, 1000.0, 300.0) == 0  # the same instant twice: counted once
    assert shares(10, ["a", "b", "c"]) == {"a": 4, "b": 3, "c": 3}
    assert sum(shares(7_777, ["a", "b", "c", "d"]).values()) == 7_777


def test_a_window_without_sweeps_says_it_has_no_data() -> None:
    from gpubot.core.usage.report import Coverage, UsageReport

    empty = UsageReport(Window.of("1d", None, NOW), "user", (), Coverage(0, 300.0))
    assert "no data: no sweep counted GPU-hours in this window" in empty.text()
    assert "no data missing" not in empty.text()
