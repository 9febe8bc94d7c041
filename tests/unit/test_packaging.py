"""Each wheel ships every package of its own distribution and nothing of the other's.

gpubot's packages are found (``setup.py``), ``migrations/`` shipping as ``gpubot_migrations``;
the simulator is a distribution of its own (``sim/``, the ``demo`` extra), which ``pip install
gpubot`` must leave out. The wheels are built in this process from copies of the sources, so the
checkout gets no build folder.
"""

from __future__ import annotations

import contextlib
import shutil
import zipfile
from pathlib import Path

import pytest
from setuptools import build_meta

ROOT = Path(__file__).resolve().parents[2]
SOURCES = {
    "gpubot": (ROOT, ("pyproject.toml", "setup.py", "README.md", "gpubot", "migrations")),
    "gpusim": (ROOT / "sim", ("pyproject.toml", "gpusim")),
}


def _build(name: str, tmp: Path) -> set[str]:
    """Build distribution ``name`` from a copy of its sources; return its wheel's file names."""
    src, items = SOURCES[name]
    copy = tmp / name
    for item in items:
        if (src / item).is_dir():
            shutil.copytree(src / item, copy / item, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            copy.mkdir(parents=True, exist_ok=True)
            shutil.copy(src / item, copy / item)
    with contextlib.chdir(copy):
        wheel = build_meta.build_wheel(str(tmp / f"{name}-dist"))
    with zipfile.ZipFile(tmp / f"{name}-dist" / wheel) as zf:
        return set(zf.namelist())


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    tmp = tmp_path_factory.mktemp("wheels")
    return {name: _build(name, tmp) for name in SOURCES}


def _packages(folder: Path, as_name: str) -> set[str]:
    """The packages under ``folder`` (which installs as ``as_name``), dotted."""
    return {
        ".".join((as_name, *p.parent.relative_to(folder).parts))
        for p in folder.rglob("__init__.py")
    }


def _shipped(files: set[str]) -> set[str]:
    return {
        f.removesuffix("/__init__.py").replace("/", ".") for f in files if f.endswith("__init__.py")
    }


def test_gpubot_ships_every_package_of_its_own_and_no_simulator(
    wheels: dict[str, set[str]],
) -> None:
    files = wheels["gpubot"]
    own = _packages(ROOT / "gpubot", "gpubot") | _packages(ROOT / "migrations", "gpubot_migrations")
    assert {"gpubot.core", "gpubot_migrations.versions"} <= own
    assert _shipped(files) == own
    assert {"gpubot/py.typed", "gpubot_migrations/script.py.mako"} <= files
    assert [f for f in files if "gpusim" in f] == []


def test_gpusim_ships_every_package_of_its_own_and_nothing_of_gpubot(
    wheels: dict[str, set[str]],
) -> None:
    files = wheels["gpusim"]
    assert _shipped(files) == _packages(ROOT / "sim" / "gpusim", "gpusim") >= {"gpusim"}
    assert "gpusim/py.typed" in files
    assert [f for f in files if "gpubot" in f] == []
