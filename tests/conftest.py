"""Shared pytest configuration: fixture modules live in tests/fixtures/."""

from __future__ import annotations

import importlib.util

# Fixture plugins; each is a module of tests/fixtures.
_PLUGINS = ("tests.fixtures.fleet", "tests.fixtures.db", "tests.fixtures.slack")
pytest_plugins = [m for m in _PLUGINS if importlib.util.find_spec(m) is not None]
