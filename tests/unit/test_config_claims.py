"""``[claims]``: off by default, values, one-line refusals, the example holds every key."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from gpubot.config import parse
from gpubot.config.claims import CLAIM_KEYS
from gpubot.core.claims.rules import ClaimSettings, GroupLimit
from gpubot.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "gpubot.example.toml"


def test_off_by_default_and_values() -> None:
    assert parse({}).claims == ClaimSettings() and not ClaimSettings().enabled
    s = parse(
        {"claims": {"enabled": True, "max_hours": 8, "groups": {"h200": {"max_gpus_per_user": 2}}}}
    ).claims
    assert (s.enabled, s.max_hours, s.groups) == (True, 8.0, (GroupLimit("h200", None, 2),))
    assert s.limits_for(("h200",)) == (8.0, 2) and s.limits_for(()) == (8.0, 8)


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ({"enabled": "yes"}, "claims.enabled: expected true or false"),
        ({"max_hours": 0}, "claims.max_hours: expected seconds > 0"),
        ({"max_gpus_per_user": 1.5}, "claims.max_gpus_per_user: expected a whole number > 0"),
        ({"hold": 3}, "claims.hold: unknown key"),
        ({"groups": {"g": {}}}, "claims.groups.g: expected max_hours or max_gpus_per_user"),
        ({"groups": {"g": {"max": 1}}}, "claims.groups.g.max: unknown key"),
    ],
)
def test_bad_values_are_one_line_errors(table: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse({"claims": table}, "g.toml")
    assert str(exc.value).startswith(f"g.toml: {said}") and "\n" not in str(exc.value)


def test_the_example_holds_every_claim_key() -> None:
    raw = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    assert set(raw["claims"]) == CLAIM_KEYS
    example = parse(raw).claims
    assert example.groups == (GroupLimit("h200", 12.0, 4),)
    assert parse({"claims": {k: v for k, v in raw["claims"].items() if k != "groups"}}).claims == (
        ClaimSettings()
    )
