"""Shared pytest configuration: fixture modules live in tests/fixtures/."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

import gpubot.matrix.ids  # (as gpubot.cli does: the settings name Matrix people)
import gpubot.slack.ids  # noqa: F401  (as gpubot.app does: the settings name Slack's ids)

# Fixture plugins; each is a module of tests/fixtures.
_PLUGINS = (
    "tests.fixtures.fleet",
    "tests.fixtures.db",
    "tests.fixtures.slack",
    "tests.fixtures.runtimes",
    "tests.fixtures.slurm",
    "tests.fixtures.prometheus",
    "tests.fixtures.synapse",
    "tests.fixtures.matrix",
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

# Tests write only under temporary folders. gpubot's default database is ``sqlite:///gpubot.db``
# in the working directory, so a test that runs gpubot without its own database URL (or cwd)
# would leave one in the checkout: the run fails then, naming the file.
_CHECKOUT = Path(__file__).resolve().parent.parent
_STRAYS = ("gpubot.db", "gpubot.db-wal", "gpubot.db-journal")
_BEFORE = {name for name in _STRAYS if (_CHECKOUT / name).exists()}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: the controller checks once, after all of them
    new = [n for n in _STRAYS if (_CHECKOUT / n).exists() and n not in _BEFORE]
    if new:
        print(f"\nERROR: a test wrote {', '.join(new)} into the checkout ({_CHECKOUT})")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
