"""Shared pytest configuration: fixture modules live in tests/fixtures/."""

from __future__ import annotations

import importlib.util
import os

from hypothesis import HealthCheck, settings

# Fixture plugins; each is a module of tests/fixtures.
_PLUGINS = (
    "tests.fixtures.fleet",
    "tests.fixtures.db",
    "tests.fixtures.slack",
    "tests.fixtures.runtimes",
    "tests.fixtures.slurm",
)
pytest_plugins = [m for m in _PLUGINS if importlib.util.find_spec(m) is not None]

# Hypothesis on a busy shared machine: no per-example deadline and no "too slow" health checks
# (a loaded 2-core box makes both fail for reasons that are not the code's), the same examples
# on every run (a failure reproduces), and the blob to replay one. HYPOTHESIS_PROFILE picks
# another profile ("dev": Hypothesis's defaults, random examples).
settings.register_profile(
    "ci",
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
