"""``[audit] seal_every``, ``max_seal_age`` and ``head_file``; the example file holds them."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from gpubot.config import parse
from gpubot.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "gpubot.example.toml"


def test_defaults() -> None:
    a = parse({}).audit
    assert (a.seal_every_s, a.max_seal_age_s, a.check_seals, a.head_file) == (
        900.0,
        None,
        True,
        None,
    )


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ({"seal_every": "5m"}, (300.0, None, True, None)),
        ({"seal_every": "off"}, (None, None, True, None)),
        ({"max_seal_age": "1h"}, (900.0, 3600.0, True, None)),
        ({"max_seal_age": "off"}, (900.0, None, False, None)),
        ({"seal_every": "off", "max_seal_age": "10m"}, (None, 600.0, True, None)),
        (
            {"head_file": "/var/lib/gpubot/audit.head"},
            (900.0, None, True, "/var/lib/gpubot/audit.head"),
        ),
    ],
)
def test_values(table: dict[str, Any], expected: tuple[Any, ...]) -> None:
    a = parse({"audit": table}).audit
    assert (a.seal_every_s, a.max_seal_age_s, a.check_seals, a.head_file) == expected


def test_a_head_file_under_home_is_expanded() -> None:
    path = parse({"audit": {"head_file": "~/audit.head"}}).audit.head_file
    assert path is not None and path.startswith("/") and path.endswith("/audit.head")


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ({"seal_every": "30s"}, "audit.seal_every: expected a duration of at least 1m"),
        ({"seal_every": 900}, "audit.seal_every: expected a duration of at least 1m"),
        ({"max_seal_age": "soon"}, "audit.max_seal_age: expected a duration of at least 1m"),
        (
            {"max_seal_age": "10m"},
            "audit.max_seal_age: 10m is shorter than audit.seal_every "
            "(15m): every verify between two seals would fail",
        ),
        ({"head_file": "audit.head"}, "audit.head_file: expected an absolute file path"),
        ({"head_file": "/var/lib/gpubot/"}, "audit.head_file: expected an absolute file path"),
        ({"head_file": ""}, "audit.head_file: expected a non-empty string"),
        ({"head_file": 3}, "audit.head_file: expected a non-empty string"),
        ({"seal": "15m"}, "audit.seal: unknown key"),
    ],
)
def test_bad_values_are_one_line_naming_the_key(table: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse({"audit": table}, "gpubot.toml")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("gpubot.toml: ") and words in msg


def test_the_example_holds_every_audit_key() -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    assert parse(tomllib.loads(text)).audit.seal_every_s == 900.0
    # The commented keys are meant to be uncommented as they stand.
    for key in ("max_seal_age", "head_file"):
        assert f"\n# {key} = " in text
        text = text.replace(f"\n# {key} = ", f"\n{key} = ")
    a = parse(tomllib.loads(text)).audit
    assert (a.max_seal_age_s, a.head_file) == (1800.0, "/var/lib/gpubot/audit.head")
