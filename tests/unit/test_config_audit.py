"""The ``[audit]`` settings and ``$GPUBOT_AUDIT_KEY``."""

from __future__ import annotations

from typing import Any

import pytest

from gpubot.config import audit_key, parse
from gpubot.errors import ConfigError


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("24h", 86400.0),
        ("30m", 1800.0),
        ("7d", 604800.0),
        ("1w", 604800.0),
        ("90s", 90.0),
        (" 2h ", 7200.0),
        ("1h30m", 5400.0),  # one grammar (core.durations): combined units and decimals
        ("1.5h", 5400.0),
        ("off", None),
    ],
)
def test_publish_head_every(value: str, seconds: float | None) -> None:
    assert parse({"audit": {"publish_head_every": value}}).audit.publish_head_every_s == seconds


def test_publish_head_every_defaults_to_a_day() -> None:
    assert parse({}).audit.publish_head_every_s == 86400.0


@pytest.mark.parametrize("value", ["soon", 86400, "24", "10s", "0h", "30m1h", "", True, "24 hours"])
def test_a_bad_interval_is_one_line_naming_the_key(value: Any) -> None:
    with pytest.raises(ConfigError) as e:
        parse({"audit": {"publish_head_every": value}}, "gpubot.toml")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("gpubot.toml: audit.publish_head_every: expected a duration")


def test_unknown_audit_keys_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"audit\.publish_every: unknown key"):
        parse({"audit": {"publish_every": "1h"}})
    with pytest.raises(ConfigError, match="audit: expected a table"):
        parse({"audit": "24h"})


def test_the_audit_key_comes_from_the_environment() -> None:
    assert audit_key({}) is None
    assert audit_key({"GPUBOT_AUDIT_KEY": "  0123456789abcdef\n"}) == b"0123456789abcdef"
    for short in ("", "   ", "too-short"):
        with pytest.raises(ConfigError, match="GPUBOT_AUDIT_KEY is set but shorter than 16"):
            audit_key({"GPUBOT_AUDIT_KEY": short})
