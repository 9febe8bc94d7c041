"""The policy, sweep and metrics tables of the settings file, validated by ``gpubot.config``.

``[slack]``, ``[users]``, ``[approvals]`` and ``[permissions]`` make ``Settings.policy``;
``[sweep]`` and ``[alerts]`` make ``Settings.sweep``; ``[metrics]`` makes ``Settings.metrics``.
Every mistake is one line naming the file, the key and the problem.
"""

from __future__ import annotations

import re
from dataclasses import fields
from typing import Any

import pytest

from gpubot.config import MetricsSettings, Settings, check_port, front_ends, parse
from gpubot.core.findings import SweepConfig
from gpubot.core.policy import Policy
from gpubot.core.reset.protect import DEFAULT_SYSTEM_USERS
from gpubot.core.usage.idle import IdleRule
from gpubot.errors import ConfigError
from gpubot.slack.ids import SLACK_IDS

POLICY: dict[str, Any] = {
    "slack": {"channel": "C0GENERAL", "oncall_channel": "C0ONCALL"},
    "users": {
        "U0ALICE": "alice",
        "U0BOB": "bob",
        "email_local_part": True,
        "email_domains": ["Example.com"],
        "min_uid": 500,
    },
    "approvals": {
        "approvers": ["U0CAROL"],
        "usergroup": "S0ONCALL",
        "expiry_s": 60,
        "group_cache_s": 0,
    },
    "permissions": {"team-a": ["U0ALICE", "S0TEAMA"], "*": ["S0ADMINS"], "node9": ["*"]},
}


def refused(tables: dict[str, Any]) -> str:
    """Return the one-line message ``tables`` are refused with."""
    with pytest.raises(ConfigError) as exc:
        parse(tables, "g.toml")
    line = str(exc.value)
    assert line.startswith("g.toml: ") and "\n" not in line
    return line


def test_settings_are_typed_fields_only() -> None:
    names = {f.name for f in fields(Settings)}
    assert {"policy", "sweep", "metrics"} <= names and "extra" not in names
    s = parse({})
    assert (s.policy, s.sweep, s.metrics) == (
        Policy(bots=SLACK_IDS.bots),
        SweepConfig(),
        MetricsSettings(),
    )


# --- the policy ----------------------------------------------------------------------------------


def test_the_policy_tables() -> None:
    p = parse({**POLICY, "reset": {"system_users": ["root", "gdm"]}}, "g.toml").policy
    assert p.users == {"U0ALICE": "alice", "U0BOB": "bob"}
    assert p.email_local_part and p.email_domains == ("example.com",)
    assert p.approvers == frozenset({"U0CAROL"}) and p.approver_groups == ("S0ONCALL",)
    assert (p.expiry_s, p.min_uid, p.group_cache_s) == (60.0, 500, 0.0)
    assert (p.channel, p.approval_channel) == ("C0GENERAL", "C0ONCALL")
    assert p.groups_to_resolve() == ("S0ADMINS", "S0ONCALL", "S0TEAMA")
    assert p.permissions == {"team-a": ("U0ALICE", "S0TEAMA"), "*": ("S0ADMINS",), "node9": ("*",)}
    assert p.system_users == ("root", "gdm")  # [reset] system_users: never mapped to


def test_policy_defaults() -> None:
    p = parse({}).policy
    assert p == Policy(bots=SLACK_IDS.bots) and p.system_users == DEFAULT_SYSTEM_USERS
    assert (p.expiry_s, p.min_uid, p.group_cache_s) == (900.0, 1000, 60.0)
    assert p.permissions is None and p.approval_channel is None  # no table: everyone
    assert parse({"permissions": {}}).policy.permissions == {}  # an empty table: no one
    assert parse({"slack": {"channel": "C1X"}}).policy.approval_channel == "C1X"
    groups = parse({"approvals": {"usergroup": ["S1A", "S2X"]}}).policy.approver_groups
    assert groups == ("S1A", "S2X")


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ({"slack": []}, "slack: expected a table"),
        ({"slack": {"chanel": "C1"}}, "slack.chanel: unknown key"),
        (
            {"slack": {"channel": "#general"}},
            "slack.channel: expected a channel id (C…), got '#general'",
        ),
        ({"slack": {"oncall_channel": 5}}, "slack.oncall_channel: expected a channel id"),
        ({"users": {"U0A": "Alice Smith"}}, "users.U0A: expected a Linux user name"),
        (
            {"users": {"alice": "alice"}},
            "users.alice: not a Slack user id (U…/W…) or a Matrix user id (@name:server), "
            "email_local_part, email_domains or min_uid",
        ),
        ({"users": {"email_local_part": "yes"}}, "users.email_local_part: expected true or false"),
        ({"users": {"email_local_part": True}}, "users.email_local_part: needs users.email_do"),
        ({"users": {"email_local_part": True, "email_domains": []}}, "needs users.email_domains"),
        (
            {"users": {"email_domains": "example.com"}},
            "users.email_domains: expected a list of non-empty strings",
        ),
        (
            {"users": {"email_domains": ["@example.com"]}},
            "users.email_domains: '@example.com' is not a domain",
        ),
        ({"users": {"min_uid": -1}}, "users.min_uid: expected a uid from 0 to 2147483647, got -1"),
        ({"users": {"min_uid": "1000"}}, "users.min_uid"),
        ({"users": {"min_uid": True}}, "users.min_uid"),
        ({"users": {"min_uid": 2**31}}, "users.min_uid"),
        (
            {"approvals": {"approvers": "U0A"}},
            "approvals.approvers: expected a list of non-empty strings",
        ),
        ({"approvals": {"approvers": [""]}}, "approvals.approvers: expected a list of non-empty"),
        (
            {"approvals": {"approvers": ["alice"]}},
            "approvals.approvers: 'alice' is not a Slack user id (U…/W…) or a Matrix user id",
        ),
        (
            {"approvals": {"usergroup": "U0A"}},
            "approvals.usergroup: 'U0A' is not a Slack user group id",
        ),
        (
            {"approvals": {"expiry_s": 0}},
            "approvals.expiry_s: expected seconds > 0 and <= 604800, got 0",
        ),
        ({"approvals": {"expiry_s": True}}, "approvals.expiry_s: expected seconds"),
        ({"approvals": {"expiry_s": "15m"}}, "approvals.expiry_s: expected seconds"),
        (
            {"approvals": {"group_cache_s": -1}},
            "approvals.group_cache_s: expected seconds from 0 to 3600, got -1",
        ),
        ({"approvals": {"group_cache_s": 3601}}, "approvals.group_cache_s"),
        ({"approvals": {"group_cache_s": "1m"}}, "approvals.group_cache_s"),
        ({"approvals": {"quorum": 2}}, "approvals.quorum: unknown key"),
        ({"permissions": {"team a": ["*"]}}, "permissions.team a: not a node or group name"),
        (
            {"permissions": {"team-a": ["alice"]}},
            "permissions.team-a: 'alice' is not a Slack user id (U…/W…) or a Matrix user id "
            '(@name:server), a Slack user group id (S…) or "*"',
        ),
        (
            {"permissions": {"team-a": "U0A"}},
            "permissions.team-a: expected a list of non-empty strings",
        ),
        ({"permissions": "everyone"}, "permissions: expected a table"),
    ],
)
def test_bad_policy_tables_name_the_key(tables: dict[str, Any], message: str) -> None:
    assert message in refused(tables)


# --- sweeps, alerts and metrics -------------------------------------------------------------------


def test_sweep_and_metrics_defaults_and_values() -> None:
    s = parse({})
    c = s.sweep
    assert (c.interval_s, c.budget_s, c.reminder_s) == (300.0, 240.0, 21600.0)
    assert c.idle == IdleRule(4096, 4.0, 14 * 86400.0) and c.idle.enabled  # on by default
    assert c.max_gap_s == 450.0  # one missed sweep breaks an idle run
    assert c.channel is None and s.metrics == MetricsSettings(None, "127.0.0.1")
    c = parse({"sweep": {"interval_s": 60}, "slack": {"channel": "C0ALERTS"}}).sweep
    assert (c.budget_s, c.channel) == (48.0, "C0ALERTS")  # alerts go to [slack] channel
    s = parse(
        {
            "sweep": {
                "interval_s": 120,
                "budget_s": 90,
                "orphan_threshold_mib": 0,
                "idle_min_mib": 2048,
                "idle_hours": 1.5,
                "keep_samples": "2d12h",
            },
            "alerts": {"channel": "C0SWEEP", "reminder_s": 3600},
            "slack": {"channel": "C0OTHER"},
            "metrics": {"port": 9400, "host": "0.0.0.0"},
        }
    )
    assert s.sweep == SweepConfig(120.0, 90.0, 0, IdleRule(2048, 1.5, 216000.0), 3600.0, "C0SWEEP")
    assert s.metrics == MetricsSettings(9400, "0.0.0.0")
    off = parse({"sweep": {"idle_hours": 0, "keep_samples": "30m"}}).sweep
    assert not off.idle.enabled and off.idle.keep_s == 1800.0  # off: any retention will do


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ({"sweep": {"interval": 5}}, "sweep.interval: unknown key"),
        ({"sweep": {"interval_s": 0}}, "sweep.interval_s: expected a number > 0, got 0"),
        ({"sweep": {"interval_s": "5m"}}, "sweep.interval_s: expected a number > 0"),
        (
            {"sweep": {"interval_s": 60, "budget_s": 61}},
            "sweep.budget_s: 61 is longer than sweep.interval_s (60)",
        ),
        (
            {"sweep": {"orphan_threshold_mib": 1.5}},
            "sweep.orphan_threshold_mib: expected a whole number >= 0, got 1.5",
        ),
        (
            {"sweep": {"idle_holder": {"enabled": True}}},
            "sweep.idle_holder: replaced by sweep.idle_min_mib, sweep.idle_hours (0: off) and "
            'sweep.keep_samples (e.g. "14d"); remove the [sweep.idle_holder] table',
        ),
        ({"sweep": {"idle_holder": True}}, "sweep.idle_holder: replaced by"),
        ({"sweep": {"idle_hours": -1}}, "sweep.idle_hours: expected a number >= 0, got -1"),
        ({"sweep": {"idle_hours": "4h"}}, "sweep.idle_hours: expected a number >= 0, got '4h'"),
        ({"sweep": {"idle_min_mib": 0}}, "sweep.idle_min_mib: expected a whole number > 0"),
        ({"sweep": {"idle_min_mib": 4096.5}}, "sweep.idle_min_mib: expected a whole number"),
        (
            {"sweep": {"keep_samples": 14}},
            'sweep.keep_samples: expected a duration like "90s", "30m", "1h30m", "1.5h", "2d" or '
            '"1w2d" (units w, d, h, m, s, largest first, each at most once), got 14',
        ),
        ({"sweep": {"keep_samples": "14"}}, "sweep.keep_samples: expected a duration like"),
        ({"sweep": {"keep_samples": "14 days"}}, "got '14 days'"),
        ({"sweep": {"keep_samples": "0d"}}, "greater than zero, got '0d'"),
        (
            {"sweep": {"keep_samples": "2h"}},
            "sweep.keep_samples: 2h is shorter than sweep.idle_hours (4 h): no GPU could ever be "
            "seen idle that long",
        ),
        ({"sweep": []}, "sweep: expected a table"),
        ({"alerts": {"channel": "#gpu"}}, "alerts.channel: expected a channel id (C…), got '#gpu'"),
        ({"alerts": {"reminder_s": -1}}, "alerts.reminder_s: expected a number > 0, got -1"),
        ({"alerts": {"every": 1}}, "alerts.every: unknown key"),
        (
            {"metrics": {"port": 70000}},
            "metrics.port: 70000 is not a port number (0-65535, 0: any free port)",
        ),
        ({"metrics": {"port": True}}, "metrics.port: True is not a port number"),
        ({"metrics": {"host": ""}}, "metrics.host: expected an address, got ''"),
        ({"metrics": {"path": "/m"}}, "metrics.path: unknown key"),
    ],
)
def test_bad_sweep_tables_name_the_key(tables: dict[str, Any], message: str) -> None:
    assert message in refused(tables)


def test_a_zero_bound_says_zero_is_allowed() -> None:
    assert "reset.grace_s: expected a number >= 0, got -1" in refused({"reset": {"grace_s": -1}})
    assert "reset.verify_timeout_s: expected a number > 0, got 0" in refused(
        {"reset": {"verify_timeout_s": 0}}
    )


def test_check_port_names_what_it_checks() -> None:
    assert check_port(0, "--metrics-port") == 0 and check_port(9400, "--metrics-port") == 9400
    for bad in (-1, 65536, "9400", True):
        with pytest.raises(ConfigError, match=r"^--metrics-port: .* is not a port number"):
            check_port(bad, "--metrics-port")


MATRIX = front_ends.IdForms(
    "matrix",
    user=re.compile(r"@[a-z0-9._=-]+:[a-z0-9.-]+"),
    group=re.compile(r"\+[a-z0-9._=-]+:[a-z0-9.-]+"),
    place=re.compile(r"![A-Za-z0-9]+:[a-z0-9.-]+"),
    user_words="a Matrix user id (@name:server)",
    group_words="a Matrix community (+name:server)",
    place_words="a Matrix room id (!id:server)",
)


def test_the_settings_take_the_ids_of_the_front_end_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shared settings code knows no front end: another one's forms check its ids."""
    monkeypatch.setattr(front_ends, "KNOWN", {"matrix": MATRIX})
    s = parse(
        {
            "matrix": {"channel": "!ops:lab.example"},
            "users": {"@alice:lab.example": "alice"},
            "approvals": {"approvers": ["@bob:lab.example"], "usergroup": "+oncall:lab.example"},
            "permissions": {"*": ["+oncall:lab.example", "@alice:lab.example"]},
        }
    )
    assert s.policy.users == {"@alice:lab.example": "alice"}
    assert s.policy.channel == s.sweep.channel == "!ops:lab.example"
    assert s.policy.permission_groups == {"+oncall:lab.example"}
    with pytest.raises(ConfigError, match=r"users\.U012ABC: not a Matrix user id"):
        parse({"users": {"U012ABC": "alice"}})
    with pytest.raises(ConfigError, match="slack: unknown key"):  # Slack's section is Slack's
        parse({"slack": {"channel": "C0123"}})


def test_ids_without_a_front_end_to_check_them_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(front_ends, "KNOWN", {})
    assert parse({"users": {"min_uid": 500}}).policy.bots == frozenset()  # nothing to check
    with pytest.raises(ConfigError, match=r"users\.U0A: no chat front end is loaded"):
        parse({"users": {"U0A": "alice"}})
    with pytest.raises(ConfigError, match=r"alerts\.channel: no chat front end is loaded"):
        parse({"alerts": {"channel": "C0A"}})
