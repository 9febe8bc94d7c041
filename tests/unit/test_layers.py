"""The design's layering, checked by walking imports."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "gpubot"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def _files(sub: str) -> list[Path]:
    return sorted((PKG / sub).rglob("*.py"))


@pytest.mark.parametrize("path", _files("core"), ids=lambda p: p.name)
def test_core_imports_only_stdlib(path: Path) -> None:
    for mod in _imports(path):
        top = mod.split(".")[0]
        allowed = top in sys.stdlib_module_names or mod.startswith(("gpubot.core", "gpubot.errors"))
        assert allowed, f"{path.name} imports {mod}"


LIBS = {
    "asyncssh": ("ssh", "sim"),
    "sqlalchemy": ("store",),
    "alembic": ("store",),
    "slack_bolt": ("slack",),
    "slack_sdk": ("slack",),
    "apscheduler": ("scheduler.py",),
    "pynvml": ("ssh",),
}


@pytest.mark.parametrize("lib", sorted(LIBS))
def test_each_library_lives_in_its_adapter(lib: str) -> None:
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).as_posix()
        if any(m.split(".")[0] == lib for m in _imports(path)):
            assert rel.startswith(LIBS[lib]), f"{rel} imports {lib}"


@pytest.mark.parametrize("path", _files("services") + _files("core"), ids=lambda p: p.name)
def test_services_and_core_do_not_read_environment(path: Path) -> None:
    assert "os.environ" not in path.read_text(encoding="utf-8"), path.name
