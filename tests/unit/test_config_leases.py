"""``[leases] ttl_s`` and ``renew_s``: defaults, refusals in one line, the example holds them."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from gpubot.config import parse
from gpubot.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "gpubot.example.toml"


def test_defaults_and_values() -> None:
    d = parse({}).leases
    assert (d.ttl_s, d.renew_s) == (30.0, 5.0)
    s = parse({"leases": {"ttl_s": 10, "renew_s": 2.5}}).leases
    assert (s.ttl_s, s.renew_s) == (10.0, 2.5)


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ({"ttl_s": 0}, "leases.ttl_s: expected seconds > 0 and <= 3600, got 0"),
        ({"ttl_s": "30s"}, "leases.ttl_s: expected seconds > 0 and <= 3600, got '30s'"),
        ({"renew_s": -1}, "leases.renew_s: expected seconds > 0 and <= 3600, got -1"),
        ({"ttl_s": 8}, "leases.renew_s: 5 s is more than half of leases.ttl_s (8 s)"),
        ({"ttl": 8}, "leases.ttl: unknown key"),
    ],
)
def test_bad_values_are_one_line_errors(table: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse({"leases": table}, "g.toml")
    assert str(exc.value).startswith(f"g.toml: {said}")
    assert "\n" not in str(exc.value)


def test_the_example_holds_every_lease_key() -> None:
    raw = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    assert set(raw["leases"]) == {"ttl_s", "renew_s"}
    assert parse(raw).leases == parse({}).leases  # the example says the defaults
