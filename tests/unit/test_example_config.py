"""``gpubot.example.toml`` holds every key the validator accepts, each with a comment, and loads
through the real loader as it stands and with its ``# key = …`` lines uncommented.

The keys come from the validator itself: ``Validator.keys`` is recorded while the example
loads, so a key added to ``gpubot.config`` fails here until the example has it, and a key the
validator rejects fails the load. ``[users]`` (Slack ids besides ``USERS_KEYS``),
``[permissions]`` and ``[groups]`` name their own keys: their tables must be there.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from gpubot.config import load, tables
from gpubot.config.validate import Validator
from gpubot.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "gpubot.example.toml"
HEADER = re.compile(r"\s*\[\[?\s*([A-Za-z0-9_.-]+)\s*\]\]?")
OPTIONAL = re.compile(r"# ([a-z_]+) = ")  # a key left for the admin to uncomment as it stands
ASSIGNED = re.compile(r"\s*([A-Za-z0-9_\"*-]+)\s*=")
DATA_TABLES = ("users", "permissions", "groups", "teams")  # tables whose keys are names or ids

Accepted = dict[str, set[str]]  # "ssh", "nodes", "groups.*", "" (the top) -> keys


def uncommented(text: str) -> str:
    """Return ``text`` with each ``# key = …`` line uncommented where its table does not set
    that key already (``# url = "postgresql…"`` beside a set ``url`` is an alternative)."""
    raw = tomllib.loads(text)
    out, table = [], ""
    for line in text.splitlines():
        if m := HEADER.match(line):
            table = m[1]
        o = OPTIONAL.match(line)
        if o and all(o[1] not in t for t in _tables_of(raw, table)):
            line = line[2:]
        out.append(line)
    return "\n".join(out) + "\n"


def _tables_of(raw: Mapping[str, Any], dotted: str) -> list[Mapping[str, Any]]:
    """Return the tables at ``dotted`` (every one of an array of tables); [{}] when none."""
    found: list[Any] = [raw]
    for part in (p for p in dotted.split(".") if p):
        nxt: list[Any] = []
        for t in found:
            v = t.get(part, {})
            nxt += v if isinstance(v, list) else [v]
        found = nxt
    return [t for t in found if isinstance(t, Mapping)] or [{}]


def accepted(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Accepted, Any]:
    """Load ``path`` with the real loader; return the keys each table accepts, and settings."""
    seen: Accepted = {}
    real = Validator.keys

    def record(self: Validator, section: str, table: Mapping[str, Any], allowed: set[str]) -> None:
        name = re.sub(r"\[\d+\]$", "", section)
        name = "groups.*" if name.startswith("groups.") else name
        seen.setdefault(name, set()).update(allowed)
        real(self, section, table, allowed)

    with monkeypatch.context() as m:
        m.setattr(Validator, "keys", record)
        settings = load(path)
    return seen, settings


def tables_for(raw: Mapping[str, Any], section: str) -> list[Mapping[str, Any]]:
    if section == "groups.*":
        return [t for t in raw.get("groups", {}).values() if isinstance(t, Mapping)]
    return _tables_of(raw, section) if section else [raw]


def missing(raw: Mapping[str, Any], keys: Accepted) -> list[str]:
    """Return each accepted key (``ssh.keepalive_s``) that no table of ``raw`` holds."""
    gaps = [f"[{t}]" for t in DATA_TABLES if t not in raw]
    for section, allowed in sorted(keys.items()):
        present = {k for t in tables_for(raw, section) for k in t}
        prefix = f"{section}." if section else ""
        gaps += [f"{prefix}{k}" for k in sorted(allowed - present)]
    users = raw.get("users", {})
    gaps += [f"users.{k}" for k in tables.USERS_KEYS if k not in users]
    return gaps


def assignments(text: str) -> Iterator[tuple[str, str, bool]]:
    """Yield (table, key, commented) for each assignment: commented when its line has a
    comment or it stands in a block of lines (no blank line) under a comment or header that
    has one."""
    table, block = "", False
    for line in text.splitlines():
        if m := HEADER.match(line):
            table, block = m[1], "#" in line
        elif line.startswith("#"):
            block = True
        elif not line.strip():
            block = False
        elif (a := ASSIGNED.match(line)) and not line.startswith(" "):
            yield table, a[1].strip('"'), block or "#" in line


@pytest.fixture
def full(tmp_path: Path) -> Path:
    path = tmp_path / "full.toml"
    path.write_text(uncommented(EXAMPLE.read_text(encoding="utf-8")))
    return path


def test_the_example_loads_as_it_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    keys, settings = accepted(EXAMPLE, monkeypatch)
    assert settings.nodes and settings.policy.permissions is not None
    assert set(keys) >= {"", "ssh", "reset", "nodes", "groups.*", "sweep", "alerts", "metrics"}


def test_the_example_holds_every_key_the_validator_accepts(
    full: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys, _ = accepted(full, monkeypatch)  # uncommented, it still loads
    raw = tomllib.loads(full.read_text())
    assert missing(raw, keys) == []


def test_every_key_has_a_comment(full: Path) -> None:
    bare = [f"{t}.{k}" for t, k, commented in assignments(full.read_text()) if not commented]
    assert bare == []
    control = list(assignments("[a]  # about a\nb = 1\n\nc = 2  # c\nd = 3\n"))
    assert control == [("a", "b", True), ("a", "c", True), ("a", "d", False)]


def test_control_a_key_the_validator_gains_is_missing_from_the_example(
    full: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys, _ = accepted(full, monkeypatch)
    keys["ssh"].add("proxy_jump")
    keys["nodes"].add("proxy_jump")
    raw = tomllib.loads(full.read_text())
    assert missing(raw, keys) == ["nodes.proxy_jump", "ssh.proxy_jump"]


def test_control_a_key_dropped_from_the_example_is_missing(
    full: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    keys, _ = accepted(full, monkeypatch)
    lines = full.read_text().splitlines()
    cut = [ln for ln in lines if not ln.startswith(("budget_s", "min_uid", "[permissions]"))]
    alerts = next(i for i, ln in enumerate(cut) if ln.startswith("[alerts]"))
    raw = tomllib.loads("\n".join(cut[:alerts]))  # and [alerts] on
    assert {"sweep.budget_s", "users.min_uid", "[permissions]", "alerts.reminder_s"} <= set(
        missing(raw, keys)
    )


def test_control_the_example_with_an_unknown_key_fails_to_load(tmp_path: Path) -> None:
    text = EXAMPLE.read_text(encoding="utf-8").replace("[ssh]\n", "[ssh]\nproxy_jump = 'j'\n", 1)
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    with pytest.raises(ConfigError, match=r"ssh\.proxy_jump: unknown key"):
        load(bad)


def test_uncommenting_keeps_a_set_key_and_frees_an_optional_one() -> None:
    text = '[database]\n# url = "postgresql://x"\nurl = "sqlite:///a.db"\n[a]\n# b = 1\n'
    assert uncommented(text) == (
        '[database]\n# url = "postgresql://x"\nurl = "sqlite:///a.db"\n[a]\nb = 1\n'
    )
