"""The lock files pin what pyproject.toml allows, and every install path reads them.

These read files only. That the pins actually install and pass is CI's job (it installs from
the test lock); that newer releases still work is ``scripts/check-newest``'s, by hand.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ ;\\]+)", re.M)


def pins(name: str) -> dict[str, str]:
    """The ``name==version`` lines of a lock file, by canonical name."""
    text = (ROOT / name).read_text(encoding="utf-8")
    return {canonicalize_name(n): v for n, v in PIN.findall(text)}


def _project(folder: Path) -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((folder / "pyproject.toml").read_text("utf-8"))[
        "project"
    ]
    return project


def declared(*extras: str) -> list[Requirement]:
    """pyproject.toml's requirements: the run's, the simulator's (``sim/``, installed ``--no-deps``
    after either lock), and those of ``extras``."""
    project = _project(ROOT)
    lines = list(project["dependencies"]) + list(_project(ROOT / "sim")["dependencies"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


@pytest.mark.parametrize(
    ("lock", "extras"),
    [("requirements.lock", ("postgres",)), ("requirements-test.lock", ("postgres", "test"))],
)
def test_every_declared_dependency_is_pinned_within_its_range(
    lock: str, extras: tuple[str, ...]
) -> None:
    locked = pins(lock)
    for req in declared(*extras):
        name = canonicalize_name(req.name)
        assert name in locked, f"{req.name} is not in {lock}: run scripts/lock"
        assert req.specifier.contains(locked[name], prereleases=True), (
            f"{lock} pins {req.name}=={locked[name]}, outside {req.specifier}: run scripts/lock"
        )
    assert "setuptools" in locked, "the editable build installs without isolation"


def test_every_pin_carries_a_hash() -> None:
    for lock in ("requirements.lock", "requirements-test.lock"):
        blocks = re.split(r"\n(?=[A-Za-z0-9])", (ROOT / lock).read_text(encoding="utf-8"))
        for block in blocks:
            if PIN.match(block):
                assert "--hash=sha256:" in block, f"{lock}: {block.splitlines()[0]}"


def test_the_test_lock_runs_the_same_versions_as_the_run_lock() -> None:
    run, test = pins("requirements.lock"), pins("requirements-test.lock")
    assert {n: test.get(n) for n in run} == run


def _readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_readme_ci_and_dockerfile_install_from_the_locks() -> None:
    demo, tests = _readme_commands()
    assert "-r requirements.lock" in demo and demo.endswith("gpubot demo")
    assert "-r requirements-test.lock" in tests
    local = "--no-deps --no-build-isolation -e . -e ./sim &&"  # gpubot and its simulator
    assert local in demo and local in tests
    assert "mypy --strict gpubot sim/gpusim tests" in tests
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").rstrip().splitlines()[-1]
    assert ci == tests, "CI runs exactly the README's test command"
    # The fast tier runs first and the rest after it; neither may be empty (pytest's exit 5).
    assert tests.index("pytest tests/unit") < tests.index("pytest tests/contract tests/integration")
    docker = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    assert "--require-hashes --wheel-dir /wheels -r requirements.lock" in docker
    assert "--no-index --no-deps /wheels/*.whl" in docker
    copied = [line for line in docker.splitlines() if line.startswith("COPY")]
    assert not [c for c in copied if "sim" in c], "the image ships gpubot without its simulator"
