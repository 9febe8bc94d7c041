"""The design's layering, checked by walking imports."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "gpubot"
SIM = PKG.parent / "gpusim"  # the simulated fleet: its own package, beside the product


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
    "asyncssh": ("transport",),
    "sqlalchemy": ("store",),
    "alembic": ("store",),
    "slack_bolt": ("slack",),
    "slack_sdk": ("slack",),
    "apscheduler": ("scheduler.py",),
    "pynvml": ("transport",),
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


def _imports_of(sub: str) -> list[tuple[str, str]]:
    """Return (file, module) of every import in the files of ``sub`` (a folder or file)."""
    paths = [PKG / sub] if sub.endswith(".py") else _files(sub)
    return [(p.relative_to(PKG).as_posix(), m) for p in paths for m in _imports(p)]


def _is(mod: str, *names: str) -> bool:
    return any(mod == n or mod.startswith(n + ".") for n in names)


ADAPTERS = (
    "gpubot.store",
    "gpubot.transport",
    "gpubot.slack",
    "gpusim",
    "sqlalchemy",
    "alembic",
    "asyncssh",
    "slack_bolt",
    "slack_sdk",
    "pynvml",
    "apscheduler",
    "prometheus_client",
    "aiohttp",
)


def test_services_import_no_adapter() -> None:
    bad = [(f, m) for f, m in _imports_of("services") if _is(m, *ADAPTERS)]
    assert bad == []


def test_chat_imports_no_slack_library_and_no_store() -> None:
    bad = [(f, m) for f, m in _imports_of("chat") if _is(m, *ADAPTERS, "gpubot.app")]
    assert bad == []


# What builds an adapter (or a long-lived service object) and where it is defined.
CONSTRUCTORS = {
    "open_store": "store/",
    "Store": "store/",
    "make_transport": "transport/",
    "DbLeases": "store/",
    "SlackApi": "slack/",
    "SlackDirectory": "slack/",
    "make_client": "slack/",
    "SlackAlerts": "slack/",
    "HeadPublisher": "slack/",
    "Metrics": "metrics.py",
    "IntervalScheduler": "scheduler.py",
    "StatusService": "services/",
    "ResetService": "services/",
    "SweepService": "services/",
    "ApprovalService": "services/",
    "NodeLocks": "services/",
}


def test_only_the_composition_root_constructs_adapters_and_services() -> None:
    bad = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).as_posix()
        if rel == "app.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                f = node.func
                name = (
                    f.id
                    if isinstance(f, ast.Name)
                    else f.attr
                    if isinstance(f, ast.Attribute)
                    else ""
                )
                home = CONSTRUCTORS.get(name)
                if home is not None and not rel.startswith(home):
                    bad.append(f"{rel}:{node.lineno} {name}()")
    assert bad == []


def test_only_the_demo_imports_the_simulator() -> None:
    bad = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).as_posix()
        if rel == "cli/demo.py":
            continue
        bad += [(rel, m) for m in _imports(path) if _is(m, "gpusim")]
    assert bad == []


def test_the_simulator_imports_nothing_of_gpubot() -> None:
    bad = [
        (p.relative_to(SIM).as_posix(), m)
        for p in sorted(SIM.rglob("*.py"))
        for m in _imports(p)
        if _is(m, "gpubot")
    ]
    assert bad == []


def test_benchmarks_do_not_import_tests() -> None:
    bench = PKG.parent / "benchmarks"
    bad = [(p.name, m) for p in sorted(bench.rglob("*.py")) for m in _imports(p) if _is(m, "tests")]
    assert bad == []


def _sizes() -> list[tuple[str, int, list[tuple[str, int]]]]:
    out = []
    for path in sorted([*PKG.rglob("*.py"), *SIM.rglob("*.py")]):
        text = path.read_text(encoding="utf-8")
        funcs = [
            (n.name, (n.end_lineno or n.lineno) - n.lineno + 1)
            for n in ast.walk(ast.parse(text))
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
        out.append((path.relative_to(PKG.parent).as_posix(), text.count("\n"), funcs))
    return out


def test_files_and_functions_stay_small() -> None:
    big = [(f, n) for f, n, _ in _sizes() if n > 450]
    long = [(f, name, n) for f, _, funcs in _sizes() for name, n in funcs if n > 60]
    assert (big, long) == ([], [])


@pytest.mark.parametrize("path", _files("services"), ids=lambda p: p.name)
def test_services_read_time_through_the_clock(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert "time" not in _imports(path), path.name
    assert "asyncio.sleep" not in text and "datetime.now" not in text, path.name
