"""The design's layering, checked by walking imports.

Every file is parsed once per run (``tests.import_graph.tree``), whatever number of rules read it.
"""

from __future__ import annotations

import ast
import functools
import importlib
import itertools
import re
import sys
from pathlib import Path

import pytest

from gpubot.core import durations
from tests.fixtures.code_rules import fmt_skips_without_a_why, slack_vocabulary
from tests.import_graph import (
    PKG,
    UNITS,
    climbs,
    cycles,
    imported,
    imports_of,
    mermaid,
    module_graph,
    module_name,
    package_files,
    readme_drawing,
    tree,
)

SIM = PKG.parent / "sim" / "gpusim"  # the simulated fleet: a distribution of its own


def _imports(path: Path) -> set[str]:
    return imported(path)


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
    "HeadPublisher": "chat/",
    "Metrics": "metrics.py",
    "IntervalScheduler": "scheduler.py",
    "StatusService": "services/",
    "ResetService": "services/",
    "SweepService": "services/",
    "ApprovalService": "services/",
    "NodeLocks": "services/",
}


def _services() -> dict[str, str]:
    """Return every ``*Service`` class of ``services/``, each at home there: a new service is
    held to the rule without being named here."""
    return {
        n.name: "services/"
        for p in _files("services")
        for n in ast.walk(tree(p))
        if isinstance(n, ast.ClassDef) and n.name.endswith("Service")
    }


def built_outside_the_root(rel: str, module: ast.Module, homes: dict[str, str]) -> list[str]:
    """Return ``file:line name()`` for each call in ``module`` (file ``rel``) that builds an
    adapter or a service of ``homes`` outside its own package."""
    return [
        f"{rel}:{n.lineno} {_callee(n)}()"
        for n in ast.walk(module)
        if isinstance(n, ast.Call) and _callee(n) in homes and not rel.startswith(homes[_callee(n)])
    ]


def test_only_the_composition_root_constructs_adapters_and_services() -> None:
    homes = CONSTRUCTORS | _services()
    root = composition_root(PKG)
    files = [p for p in PKG.rglob("*.py") if p not in root]
    bad = [b for p in files for b in built_outside_the_root(_rel(p), tree(p), homes)]
    assert bad == []


def test_control_a_second_root_is_seen_building_a_service() -> None:
    wiring = "def wire(s, t):\n    return DoctorService(s, t, parts), services.ClaimService(s)\n"
    found = built_outside_the_root("wiring.py", ast.parse(wiring), CONSTRUCTORS | _services())
    assert found == ["wiring.py:2 DoctorService()", "wiring.py:2 ClaimService()"]


def _rel(path: Path) -> str:
    return path.relative_to(PKG).as_posix()


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
            for n in ast.walk(tree(path))
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


def test_no_import_cycles_type_checking_included() -> None:
    assert cycles(module_graph()) == []


def test_no_import_climbs_a_layer() -> None:
    assert climbs(module_graph()) == []


def test_front_ends_never_import_the_app() -> None:
    bad = _imports_of("slack") + _imports_of("console") + _imports_of("matrix")
    assert [(f, m) for f, m in bad if _is(m, "gpubot.app")] == []


def test_the_composition_root_is_one_package_that_names_no_front_end() -> None:
    """The root is ``gpubot/app/`` (modules by meaning, not ``app_*.py`` cut to a size); a
    front end is passed in by the entry that chose it, so the root imports none."""
    assert sorted(_rel(p) for p in PKG.rglob("app_*.py")) + list(PKG.glob("app.py")) == []
    fronts = ("gpubot.slack", "gpubot.console", "gpubot.matrix", "slack_bolt", "slack_sdk")
    root = _imports_of("app") + _imports_of("lifecycle.py")
    assert root and [(f, m) for f, m in root if _is(m, *fronts)] == []
    # The control: an import of Slack is seen where the root would hold one.
    control = imports_of(
        ast.parse("from gpubot.slack.api import SlackApi"), "gpubot.app", True, frozenset()
    )
    assert [m for m in control if _is(m, *fronts)] == ["gpubot.slack.api"]


# What changes an object in place: a call of one of these on another object's attribute.
MUTATORS = {"append", "extend", "update", "add", "insert", "setdefault", "__setattr__"}


def _own(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _foreign(node: ast.expr) -> bool:
    """Whether ``node`` is an attribute of another object than ``self`` (``a.b``, ``self.a.b``)."""
    return isinstance(node, ast.Attribute) and not _own(node.value)


def _changes(scope: ast.AST) -> list[tuple[int, ast.expr]]:
    """Return (line, what changes) for each change under ``scope`` to another object than
    ``self``: a set (or ``del``) of its attribute, ``setattr``, ``vars(x).update``, or a mutating
    call on one of its attributes (``app.seals.after_forced.append(...)``)."""
    out: list[tuple[int, ast.expr]] = []
    for node in ast.walk(scope):
        targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else []
        if isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        out += [(t.lineno, t) for t in targets if _foreign(t)]
        if not isinstance(node, ast.Call):
            continue
        f, first = node.func, node.args[0] if node.args else None
        if isinstance(f, ast.Name) and f.id == "setattr" and first and not _own(first):
            out.append((node.lineno, first))
        elif isinstance(f, ast.Attribute) and f.attr in MUTATORS:
            on = f.value
            opener = on.func if isinstance(on, ast.Call) else None
            opened = on.args[0] if isinstance(on, ast.Call) and on.args else None
            if f.attr == "__setattr__":  # ``object.__setattr__(self, ...)`` sets an own field
                if not (_own(on) or _own(first)):
                    out.append((node.lineno, first or on))
            elif _foreign(on):
                out.append((node.lineno, on))
            elif getattr(opener, "id", "") in ("vars", "getattr") and opened and not _own(opened):
                out.append((node.lineno, opened))
    return sorted(out, key=lambda c: c[0])


def _late_sets(scope: ast.AST) -> list[int]:
    return [n for n, _ in _changes(scope)]


def composition_root(pkg: Path) -> list[Path]:
    """Return the composition root's files wherever it is (``app/``, or ``app*.py`` before
    it was a package), with the modules ``import_graph.UNITS`` counts as the root's."""
    helpers = [pkg / f"{m}.py" for m, u in UNITS.items() if u == "app"]
    files = {*(pkg / "app").rglob("*.py"), *pkg.glob("app*.py"), *helpers}
    return sorted(p for p in files if p.exists())


def _constructors(module: ast.Module) -> list[ast.AST]:
    return [
        n
        for n in ast.walk(module)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        and n.name in ("__init__", "__post_init__")
    ]


def incomplete_objects(pkg: Path) -> list[tuple[str, int]]:
    """Return (file, line) of each change to another object made by the composition root or
    by any constructor of ``pkg``."""
    root = composition_root(pkg)
    out = [(p.relative_to(pkg).as_posix(), n) for p in root for n in _late_sets(tree(p))]
    for path in sorted(set(pkg.rglob("*.py")) - set(root)):
        scopes = _constructors(tree(path))
        out += [(path.relative_to(pkg).as_posix(), n) for s in scopes for n in _late_sets(s)]
    return out


def test_the_composition_root_builds_complete_objects() -> None:
    """Each object gets what it needs when it is made: neither the root nor a constructor sets,
    or appends to, another object's attribute after that object was made."""
    assert composition_root(PKG)  # not vacuous: the root is found
    assert incomplete_objects(PKG) == []


@pytest.mark.parametrize(
    "source",
    [
        "app.parts = wire_parts(app)",
        "reset.after_forced = seals.forced",
        "app.seals.after_forced.append(app.heads.publish)",  # the root's old hook
        "status.decorators.append(health.decorate)",  # the old health checks' own wiring
        'setattr(reset, "after_forced", seals.forced)',
        "vars(sweep).update(heap=heap)",
        'object.__setattr__(reset, "after_forced", seals.forced)',
        "app.sweep.heap = app.status.heap = SweepHeap().around",  # the benchmarks' rewiring
        "self.claims.reset = self.reset",  # a constructor's setter on the object it made
        "app.hooks += [f]",
        "del app.heads",
    ],
)
def test_control_the_complete_objects_rule_sees_each_setter(source: str) -> None:
    assert _late_sets(ast.parse(source)) != []


def test_control_the_complete_objects_rule_lets_an_object_set_itself() -> None:
    own = 'self.store = s\nself.hooks.append(h)\nparts.append(p)\nsetattr(self, "x", 1)\n'
    own += 'object.__setattr__(self, "x", 1)\nvars(self).update(x=1)\n'
    assert _late_sets(ast.parse(own)) == []


def test_control_the_complete_objects_rule_finds_the_root_of_each_layout(tmp_path: Path) -> None:
    """The old layout (``app.py`` beside ``app_parts.py``) and a constructor elsewhere."""
    pkg = tmp_path / "gpubot"
    (pkg / "chat").mkdir(parents=True)
    (pkg / "app.py").write_text("def wire(app):\n    app.seals.after_forced.append(f)\n")
    (pkg / "app_parts.py").write_text("x = 1\n")
    desk = "class Flows:\n    def __init__(self, c):\n        self.claims = c\n"
    desk += "        self.claims.reset = self.reset\n    def later(self):\n        self.a.b = 1\n"
    (pkg / "chat" / "flows.py").write_text(desk)
    assert [p.name for p in composition_root(pkg)] == ["app.py", "app_parts.py"]
    assert incomplete_objects(pkg) == [("app.py", 2), ("chat/flows.py", 4)]


BENCH = PKG.parent / "benchmarks"
# A benchmark that swaps a part of the app the root built, and why it is let to. Each arm
# measures the same built app with one part set as ``serve`` sets it (the heap) or replaced by a
# scripted one (the transport); building them through ``Serving`` would start duties and
# metrics the measure leaves out.
BENCH_REWIRES = {
    ("first_sweep.py", "app.sweep.heap"),
    ("scale_store.py", "app.status.transport"),
    ("scale_store.py", "app.sweep.transport"),
    ("scale_store.py", "app.transport"),
    ("stall_locate.py", "app.sweep.heap"),
    ("status_floor.py", "app.status.heap"),
    ("status_floor.py", "app.sweep.heap"),
    ("sweep_heap.py", "app.sweep.heap"),
}


def _rooted_at_app(node: ast.expr) -> bool:
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name) and node.id == "app"


def test_benchmarks_rewire_a_built_app_only_where_listed() -> None:
    found = {
        (p.name, ast.unparse(what))
        for p in sorted(BENCH.rglob("*.py"))
        for _, what in _changes(tree(p))
        if _rooted_at_app(what)
    }
    assert found == BENCH_REWIRES


def test_services_never_import_a_front_end_or_chat() -> None:
    fronts = ("gpubot.chat", "gpubot.slack", "gpubot.cli")
    assert [(f, m) for f, m in _imports_of("services") if _is(m, *fronts)] == []


def _calls(path: Path) -> list[tuple[int, str]]:
    """Return (line, dotted name) of every call in ``path`` whose callee is a dotted name."""
    out = []
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.Call):
            parts, f = [], node.func
            while isinstance(f, ast.Attribute):
                parts.append(f.attr)
                f = f.value
            if isinstance(f, ast.Name):
                out.append((node.lineno, ".".join([f.id, *reversed(parts)])))
    return out


WALL_CLOCK = ("datetime.now", "datetime.utcnow", "datetime.today", "date.today", "asyncio.sleep")


@pytest.mark.parametrize("path", _files("chat"), ids=lambda p: p.name)
def test_chat_reads_time_only_through_the_clock(path: Path) -> None:
    assert "time" not in {m.split(".")[0] for m in _imports(path)}, path.name
    bad = [(n, c) for n, c in _calls(path) if c.endswith(WALL_CLOCK)]
    assert bad == [], path.name


def _wait_fors(path: Path) -> list[tuple[str, int]]:
    return [(path.name, n) for n, c in _calls(path) if c.split(".")[-1] == "wait_for"]


def test_bounded_waits_go_through_within_not_wait_for(tmp_path: Path) -> None:
    """``core.clock.within``: Python 3.11's ``asyncio.wait_for`` loses a cancellation that
    meets the end of what it waits for (see its docstring and tests/unit/test_store_waits.py)."""
    sample = tmp_path / "sample.py"
    sample.write_text("async def f(x):\n    await asyncio.wait_for(x, 5)\n", encoding="utf-8")
    assert _wait_fors(sample) == [("sample.py", 2)]  # the checker sees one
    assert [hit for p in sorted(PKG.rglob("*.py")) for hit in _wait_fors(p)] == []


# --- one durations module: one grammar and one formatter (core/durations.py) ---------------------

DURATIONS = PKG / "core" / "durations.py"
_UNIT = "smhdw"
_TIME_SIZES = {60, 3600, 86400, 604800}
_DURATION_NAME = re.compile(r"duration|(^|_)(ago|span|human|hms|elapsed)$|^_?fmt_", re.I)
_UNIT_TEXT = re.compile(r"\s?(s|m|h|d|w|min|mins|sec|secs|hours?|days?|minutes?)\b")
# A unit letter right after a number, as the grammar writes it (``f"{x:g}d"``). Seconds are left
# out: a timeout shown as ``0.5s`` keeps the fraction that ``durations.format`` rounds away.
_UNIT_LETTER = re.compile(r"(w|d|h|m|min)\b")
_NUMBER_SPEC = re.compile(r"[<>^=]?[+ -]?#?0?[0-9]*[,_]?(\.[0-9]+)?[bdeEfFgGn%]")


def _unit_grammar(text: str) -> bool:
    """Whether ``text`` spells duration units: a class such as ``[smhd]``, units after groups
    (``(\\d+)h(\\d+)m``) or a list of unit letters (``"smhdw"``)."""
    classes = [
        set(c.lower()) for c in re.findall(r"\[([a-zA-Z]+)\]", text) if len(set(c)) == len(c)
    ]
    after_groups = set(re.findall(r"[)}][?*+]?([smhdw])", text))
    listed = len(text) >= 3 and set(text) <= set(_UNIT) and len(set(text)) == len(text)
    return any(c <= set(_UNIT) and len(c) >= 2 for c in classes) or len(after_groups) >= 2 or listed


def _divides_time(node: ast.AST) -> bool:
    """Whether ``node`` divides by (or takes the rest of) a minute, an hour, a day or a week."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv | ast.Mod | ast.Div):
        return isinstance(node.right, ast.Constant) and node.right.value in _TIME_SIZES
    if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "divmod"):
        return False
    return any(isinstance(a, ast.Constant) and a.value in _TIME_SIZES for a in node.args[1:])


def _unit_after_value(node: ast.AST) -> bool:
    """Whether ``node`` is an f-string with a unit right after a value (``f"{n // 60}m"``)."""
    parts = node.values if isinstance(node, ast.JoinedStr) else []
    return any(
        isinstance(a, ast.FormattedValue)
        and isinstance(b, ast.Constant)
        and _UNIT_TEXT.match(str(b.value)) is not None
        for a, b in itertools.pairwise(parts)
    )


def _number_then_unit(node: ast.AST) -> bool:
    """Whether ``node`` is an f-string writing a number, then a unit letter (``f"{x:g}d"``)."""
    parts = node.values if isinstance(node, ast.JoinedStr) else []
    return any(
        isinstance(a, ast.FormattedValue)
        and isinstance(b, ast.Constant)
        and _UNIT_LETTER.match(str(b.value)) is not None
        and (
            isinstance(a.value, ast.BinOp | ast.Constant)
            or getattr(getattr(a.value, "func", None), "id", None) in {"int", "float", "round"}
            or _NUMBER_SPEC.fullmatch(ast.unparse(a.format_spec)[2:-1] if a.format_spec else "")
            is not None
        )
        for a, b in itertools.pairwise(parts)
    )


def _duration_text(key: ast.expr | None) -> bool:
    """Whether ``key`` is a text of the duration grammar (``"1h"``, ``"1h30m"``)."""
    if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
        return False
    try:
        durations.parse(key.value)
    except durations.DurationError:
        return False
    return True


def _timedelta_text(node: ast.AST) -> bool:
    """Whether ``node`` writes a ``timedelta`` as text: ``str(timedelta(...))`` or an f-string's
    ``{timedelta(...)}`` (``1 day, 0:00:00``, which no duration reads)."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "str" and node.args:
        inner: ast.AST = node.args[0]
    elif isinstance(node, ast.FormattedValue):
        inner = node.value
    else:
        return False
    func = getattr(inner, "func", None)
    return "timedelta" in (getattr(func, "id", None), getattr(func, "attr", None))


def duration_code(module: ast.Module) -> list[tuple[int, str]]:
    """Return (line, what) for each duration grammar or formatter of ``module``: a function
    named for one that does not call ``durations``, a function that divides by time units and
    writes units after values, a regex or table of unit letters, a read of the grammar's units."""
    out: list[tuple[int, str]] = []
    docs = {
        id(n.body[0].value)
        for n in ast.walk(module)
        if isinstance(n, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and n.body
        and isinstance(n.body[0], ast.Expr)
    }
    for node in ast.walk(module):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            inner = list(ast.walk(node))
            delegates = any(getattr(n, "id", None) == "durations" for n in inner)
            if _DURATION_NAME.search(node.name) and not delegates:
                out.append((node.lineno, f"def {node.name}"))
            if any(map(_divides_time, inner)) and any(map(_unit_after_value, inner)):
                out.append((node.lineno, f"{node.name} formats a duration"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docs and _unit_grammar(node.value):
                out.append((node.lineno, f"unit grammar {node.value!r}"))
        elif isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if len(keys & set(_UNIT)) >= 3:
                out.append((node.lineno, "a table of units"))
            if any(map(_duration_text, node.keys)):
                out.append((node.lineno, "a table keyed by duration texts"))
        elif isinstance(node, ast.Call | ast.FormattedValue) and _timedelta_text(node):
            out.append((node.lineno, "a timedelta written as text"))
        elif isinstance(node, ast.JoinedStr) and _number_then_unit(node):
            out.append((node.lineno, "a number written with a unit letter"))
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "UNITS"
            and getattr(node.value, "id", "") == "durations"
        ):
            out.append((node.lineno, "reads the grammar's units"))
    return out


def test_one_durations_module() -> None:
    """Every duration is parsed and shown by ``core/durations.py``: one grammar (the same text
    means the same time in a flag, a command and a setting) and one formatter."""
    files = [p for p in sorted(PKG.rglob("*.py")) if p != DURATIONS]
    assert [
        (p.relative_to(PKG).as_posix(), *hit) for p in files for hit in duration_code(tree(p))
    ] == []
    assert duration_code(tree(DURATIONS))  # the rule sees the one module's own grammar


@pytest.mark.parametrize(
    "source",
    [
        'DURATION = re.compile(r"\\s*([0-9]{1,9})\\s*([smhdw])\\s*")',
        '_DURATION = re.compile(r"(?:([0-9]{1,4})d)?(?:([0-9]{1,5})h)?(?:([0-9]{1,6})m)?")',
        'UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}',
        'def f(t):\n    return t[-1] in "smhdw"',
        "def parse_duration(text):\n    return float(text[:-1]) * 60",
        'def span(s):\n    return f"{s // 3600} h {s % 3600 // 60} min"',
        'def wait_command(c):\n    m = int(c.duration_s // 60)\n    return f"wait for {m}m"',
        "def f(t):\n    return t[-1:] in durations.UNITS",
        'SNOOZES = {"1h": 3600.0, "1d": 86400.0}',
        "def f(s):\n    return str(timedelta(seconds=s))",
        'def f(s):\n    return f"for {datetime.timedelta(seconds=s)}"',
        'def f(days):\n    return f"{days:g}d"',
        'def f(h):\n    return f"at most {h:.1f}h"',
        'def f(s):\n    return f"{s / 60}m"',
    ],
)
def test_control_the_durations_rule_sees_the_old_grammars(source: str) -> None:
    assert duration_code(ast.parse(source)) != []


@pytest.mark.parametrize(
    "source",
    [
        'KINDS = {"h": "hot", "d": "down"}',  # letters, not durations
        "def f(s):\n    return str(s - timedelta(seconds=1))",
        'def f(n):\n    return f"{n:g} GPUs on {n}d"',  # a count, and a name ending in d
        'def f(t):\n    return f"no answer in {t:g}s"',  # seconds keep their fraction
    ],
)
def test_control_the_durations_rule_leaves_what_is_no_duration_text(source: str) -> None:
    assert duration_code(ast.parse(source)) == []


# Slack's own vocabulary: Block Kit's keys and block types, and mrkdwn's mention and date tokens.
@pytest.mark.parametrize("path", _files("core") + _files("chat"), ids=lambda p: p.name)
def test_no_slack_id_or_block_kit_key_in_core_or_chat(path: Path) -> None:
    assert slack_vocabulary(tree(path)) == [], path.relative_to(PKG).as_posix()


@pytest.mark.parametrize("folder", ["gpubot", "tests", "benchmarks"])
def test_no_fmt_skip_without_a_comment_saying_why(folder: str) -> None:
    files = sorted((PKG.parent / folder).rglob("*.py"))
    bad = [(p.name, n) for p in files for n in fmt_skips_without_a_why(p.read_text("utf-8"))]
    assert bad == []


def test_the_readme_draws_the_import_graph_as_the_code_has_it() -> None:
    readme = (PKG.parent / "README.md").read_text(encoding="utf-8")
    assert readme_drawing(readme) == list(mermaid(module_graph()))


def crowded(folder: Path) -> list[str]:
    """Return the prefixes shared by three modules of ``folder`` or more, and those a module
    shares with a package beside it (``probe_x.py``, ``probe.py`` next to ``probe/``)."""
    top = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
    packages = {p.name for p in folder.iterdir() if (p / "__init__.py").exists()}
    prefixes = {name.split("_")[0] for name in top}
    return sorted(
        pre for pre in prefixes if sum(n.split("_")[0] == pre for n in top) >= 3 or pre in packages
    )


def test_core_is_grouped_by_feature() -> None:
    """A prefix shared by several core modules, at any depth, is a feature package waiting to
    be made."""
    folders = [PKG / "core", *(p.parent for p in (PKG / "core").rglob("*/__init__.py"))]
    assert len(list((PKG / "core").glob("*.py"))) <= 31
    found = {_rel(f): crowded(f) for f in sorted(folders) if crowded(f)}
    assert found == {}


def test_control_the_grouping_rule_sees_a_prefix_at_any_depth(tmp_path: Path) -> None:
    (tmp_path / "probe").mkdir()
    (tmp_path / "probe" / "__init__.py").write_text("")
    for name in ("probe", "xid", "xid_flag", "xid_table", "kinds"):
        (tmp_path / f"{name}.py").write_text("")
    assert crowded(tmp_path) == ["probe", "xid"]


# --- one extension style: explicit lists a person reads (runtimes, finding kinds) ---------------


def test_core_finds_no_module_by_scanning() -> None:
    """Runtimes and finding kinds are named in lists (``core.runtimes``, ``core.health.kinds``):
    nothing in core imports modules it found at run time."""
    bad = [(p.name, m) for p in _files("core") for m in _imports(p) if _is(m, "pkgutil")]
    bad += [(p.name, c) for p in _files("core") for _, c in _calls(p) if "import_module" in c]
    assert bad == []


def _module_names(module: ast.Module) -> list[str]:
    """Return the names a module binds at its top level by assignment (imports aside)."""
    return [
        t.id
        for node in module.body
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(t, ast.Name)
    ]


@functools.cache
def _namespaces() -> tuple[tuple[str, list[str], dict[str, object]], ...]:
    """Return (module, names it binds, its namespace) of every package module (``__main__``
    runs the command line: it binds no value)."""
    out = []
    for path in package_files():
        if path.stem != "__main__":
            mod = importlib.import_module(module_name(path))
            out.append((mod.__name__, _module_names(tree(path)), vars(mod)))
    return tuple(out)


def _values(cls: type) -> list[tuple[str, object]]:
    """Return ``(module.NAME, value)`` of every module-level name of gpubot bound to a ``cls``
    value, however made: a call, an attribute call, a factory, ``dataclasses.replace``."""
    return [
        (f"{mod}.{n}", space[n])
        for mod, names, space in _namespaces()
        for n in names
        if isinstance(space.get(n), cls)
    ]


def unlisted(found: list[tuple[str, object]], listed: tuple[object, ...]) -> list[str]:
    """Return the names of ``found`` whose value is not in ``listed``, and a note for each
    listed value no module declares (or two declare)."""
    out = [n for n, v in found if not any(v is x for x in listed)]
    out += [f"listed {x!r} declared {k} times" for x in listed if (k := _count(found, x)) != 1]
    return out


def _count(found: list[tuple[str, object]], x: object) -> int:
    return sum(v is x for _, v in found)


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def _makers(module: ast.Module, cls: str) -> set[str]:
    """Return ``cls`` and the names ``module`` imports it as."""
    return {cls} | {
        a.asname
        for n in ast.walk(module)
        if isinstance(n, ast.ImportFrom)
        for a in n.names
        if a.name == cls and a.asname
    }


def _factories(modules: list[ast.Module], cls: str) -> set[str]:
    """Return the functions that make a ``cls`` value (``container_runtime``)."""
    out = set()
    for m in modules:
        makers = _makers(m, cls)
        for f in ast.walk(m):
            if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                isinstance(c, ast.Call) and _callee(c) in makers for c in ast.walk(f)
            ):
                out.add(f.name)
    return out


def made_elsewhere(module: ast.Module, cls: str, factories: set[str]) -> list[int]:
    """Return the lines that make a ``cls`` value (a call of it, under any name, or of one of
    its ``factories``) anywhere but as a module-level name's value or inside a factory."""
    direct = _makers(module, cls)
    kept = {id(n.value) for n in module.body if isinstance(n, ast.Assign | ast.AnnAssign)}
    inside = {
        id(c)
        for f in ast.walk(module)
        if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef) and f.name in factories
        for c in ast.walk(f)
    }
    return [
        c.lineno
        for c in ast.walk(module)
        if isinstance(c, ast.Call)
        and _callee(c) in direct | factories
        and id(c) not in kept
        and not (id(c) in inside and _callee(c) in direct)
    ]


def test_every_runtime_and_finding_kind_is_in_its_list() -> None:
    from gpubot.core.findings import FindingKind
    from gpubot.core.health.kinds import KINDS
    from gpubot.core.runtimes import RUNTIMES

    modules = [tree(p) for p in package_files()]
    for cls, listed in ((type(RUNTIMES[0]), RUNTIMES), (FindingKind, KINDS)):
        assert unlisted(_values(cls), listed) == [], cls
        made = _factories(modules, cls.__name__)
        bad = [
            (p.name, n)
            for p in package_files()
            for n in made_elsewhere(tree(p), cls.__name__, made)
        ]
        assert bad == [], cls  # no value made at run time, where no list can hold it


@pytest.mark.parametrize(
    "source",
    [
        'GPU_FELL_OFF = _f.FindingKind("gpu-fell-off", "GPU fell off")',
        'GPU_FELL_OFF = K("gpu-fell-off", "GPU fell off")',
        'PODMAN = replace(docker.RUNTIME, kind="pod")',
        'GPU_FELL_OFF = type(_f.GPU_LOST)("gpu-fell-off", "GPU fell off")',
    ],
)
def test_control_an_unlisted_declaration_is_seen(source: str) -> None:
    import dataclasses

    from gpubot.core import findings
    from gpubot.core.health.kinds import KINDS
    from gpubot.core.runtimes import RUNTIMES, docker

    space: dict[str, object] = {"_f": findings, "K": findings.FindingKind, "docker": docker}
    space["replace"] = dataclasses.replace
    exec(compile(source, "control", "exec"), space)
    found = [(n, space[n]) for n in _module_names(ast.parse(source))]
    assert unlisted(found, (*KINDS, *RUNTIMES))[:1] == [_module_names(ast.parse(source))[0]]


@pytest.mark.parametrize(
    ("source", "lines"),
    [
        ('def kind_for(n):\n    return _f.FindingKind(f"xid-{n}", "Xid")\nK = [kind_for(3)]', [3]),
        (
            'from f import FindingKind as K\nasync def f(n):\n    return {n: K("x", "y")}\n'
            "async def g():\n    return await f(1)",
            [5],
        ),
        ('X = FindingKind("x", "x")\nY = (FindingKind("y", "y"),)\n', [2]),
        ('def make(k):\n    return FindingKind(k, k)\nA = make("a")\n', []),  # a factory
    ],
)
def test_control_a_kind_made_at_run_time_is_seen(source: str, lines: list[int]) -> None:
    module = ast.parse(source)
    assert made_elsewhere(module, "FindingKind", _factories([module], "FindingKind")) == lines


def _kind_name(node: ast.expr | None) -> str | None:
    """Return what ``node`` names: a name, an attribute, a string, or ``X.value``'s ``X``."""
    if isinstance(node, ast.Attribute) and node.attr == "value":
        node = node.value
    if isinstance(node, ast.Tuple) and node.elts:  # ``(kind, what)`` of a table of pairs
        return _kind_name(node.elts[0])
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)


def kind_tables(module: ast.Module, kinds: set[str]) -> list[int]:
    """Return the lines of each collection display (set, tuple, list, dict keys) or ``or`` of
    comparisons that names two finding kinds or more, by name, by ``.value`` or by stored name:
    a table of kinds, which only the list may hold."""
    out = []
    for node in ast.walk(module):
        if isinstance(node, ast.Dict):
            items: list[ast.expr | None] = list(node.keys)
        elif isinstance(node, ast.Set | ast.Tuple | ast.List):
            items = list(node.elts)
        elif isinstance(node, ast.BoolOp):
            items = [e for v in node.values if isinstance(v, ast.Compare) for e in v.comparators]
        else:
            continue
        if sum(_kind_name(n) in kinds for n in items) >= 2:
            out.append(node.lineno)
    return out


def _kind_names() -> set[str]:
    """Return the kinds' module-level names and their stored names (``gpu-xid``)."""
    from gpubot.core.findings import FindingKind

    found = _values(FindingKind)
    return {n.rsplit(".", 1)[1] for n, _ in found} | {str(v) for _, v in found}


def test_adding_a_check_touches_its_module_the_list_and_its_test() -> None:
    """No table of kinds outside the list: what a kind means is on its own value."""
    kinds = _kind_names()
    home = PKG / "core" / "health" / "kinds.py"
    bad = [
        (p.name, n)
        for p in sorted(PKG.rglob("*.py"))
        if p != home
        for n in kind_tables(tree(p), kinds)
    ]
    assert bad == []
    assert kind_tables(tree(home), kinds)  # the list itself is such a table


@pytest.mark.parametrize(
    "source",
    [
        "EVENT_KINDS = frozenset({FindingKind.GPU_XID, FindingKind.NVSWITCH_SXID})",
        'TITLES = {ORPHANED_VRAM: "orphaned GPU memory", GPU_LOST: "GPU lost", **HEALTH}',
        '_HEADINGS = {"gpu-xid": "Xid error", "nvswitch-sxid": "NVSwitch SXid error"}',
        "EVENTS = frozenset({xid.GPU_XID.value, xid.NVSWITCH_SXID.value})",
        "EVENTS = dict([(xid.GPU_XID, 1), (xid.NVSWITCH_SXID, 2)])",
        "if kind == GPU_XID or kind == NVSWITCH_SXID:\n    pass",
    ],
)
def test_control_the_kind_table_rule_sees_the_old_tables(source: str) -> None:
    assert kind_tables(ast.parse(source), _kind_names()) == [1]


def runtime_names_in(module: ast.Module) -> list[str]:
    """Return the string constants (docstrings aside) of ``module`` that name a runtime with a
    lookup or a stop: its kind, its lookup's tool, or a program its sudoers lines run."""
    from gpubot.core.runtimes import RUNTIMES

    names: set[str] = set()
    for r in RUNTIMES:
        for c in (r.sudo_stop, r.lookup.sudo if r.lookup else None):
            names |= {c.split(" ", 1)[0]} if c else set()
        names |= {r.kind, r.lookup.tool} if r.lookup else set()
    docs = {
        id(n.body[0].value)
        for n in ast.walk(module)
        if isinstance(n, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and n.body
        and isinstance(n.body[0], ast.Expr)
    }
    return [
        n.value
        for n in ast.walk(module)
        if isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and id(n) not in docs
        and _programs(n.value) & names
    ]


def _programs(text: str) -> set[str]:
    """Return the programs ``text`` runs: its first word past ``sudo`` (a plain word is its own
    program) and each path's last part (``NOPASSWD: /usr/bin/crictl inspect *`` → crictl)."""
    words = text.split()
    words = words[1:] if words[:1] == ["sudo"] else words
    return {w.rsplit("/", 1)[-1] for i, w in enumerate(words) if i == 0 or w.startswith("/")}


def test_adding_a_runtime_touches_its_module_the_list_and_its_test() -> None:
    """Outside core/runtimes/ nothing names a runtime: doctor's sudo rule, config validation and
    the rest read the runtimes' own values."""
    files = [p for p in sorted(PKG.rglob("*.py")) if "runtimes" not in p.parts]
    assert [(p.name, s) for p in files for s in runtime_names_in(tree(p))] == []


def test_control_the_runtime_rule_sees_a_table_of_runtimes() -> None:
    old = 'STOP_OF = {"docker": "docker", "podman": "podman", "slurm": "scancel"}'
    assert sorted(set(runtime_names_in(ast.parse(old)))) == ["docker", "podman", "scancel", "slurm"]


@pytest.mark.parametrize(
    "source",
    [
        'ARGV = shlex.split("docker inspect --format {{.Id}}")',
        'def stop(job):\n    return f"scancel --signal=TERM {job}"',
        'SUDOERS = "gpubot ALL=(root) NOPASSWD: /usr/bin/crictl inspect *"',
        'RULE = "sudo systemctl stop *"',
    ],
)
def test_control_the_runtime_rule_sees_a_command_line(source: str) -> None:
    assert runtime_names_in(ast.parse(source)) != []


def outbox_modules(paths: list[str]) -> list[str]:
    """Return the package files (relative paths) named for an outbox or for posts kept once."""
    return sorted(p for p in paths if "outbox" in Path(p).stem or "_posts" in Path(p).stem)


_ONCE = re.compile(r"token|once|nonce|idempoten|dedup")
_STATE = re.compile(r"state|status|posted|sent|delivered")


def post_tables(tables: dict[str, set[str]]) -> list[str]:
    """Return the tables (name → columns) that hold a post's once-only key and its state,
    whatever the columns are called (``dm_token`` and ``sent_at`` too)."""
    return sorted(
        name
        for name, cols in tables.items()
        if any(_ONCE.search(c) for c in cols) and any(_STATE.search(c) for c in cols)
    )


def test_one_outbox_for_everything_that_must_appear_once() -> None:
    """Alerts, digests, DMs, approvals' posts, the audit head, the ladder's: one service module
    and one store module keep them, over one table."""
    from gpubot.store.tables import metadata

    paths = [p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py")]
    assert outbox_modules(paths) == ["services/outbox.py", "store/outbox.py"]
    tables = {t.name: {c.name for c in t.columns} for t in metadata.tables.values()}
    assert post_tables(tables) == ["outbox"]


def test_control_the_outbox_rule_sees_the_two_outboxes_it_replaced() -> None:
    before = ["services/alert_outbox.py", "services/approval_outbox.py", "store/outbox.py"]
    before += ["store/approval_posts.py", "slack/dm_outbox.py", "core/approval/posts.py"]
    assert outbox_modules(before) != ["services/outbox.py", "store/outbox.py"]
    tables = {"alert_posts": {"token", "state"}, "approval_posts": {"token", "state"}}
    tables |= {"usage_digests": {"period", "token", "state"}, "leases": {"token", "holder"}}
    tables |= {"dm_sends": {"dm_token", "sent_at"}, "claims": {"user", "state"}}
    assert post_tables(tables) == ["alert_posts", "approval_posts", "dm_sends", "usage_digests"]


# The shared layers name no front end: a second one is added without editing them. Docstrings
# may say whose behaviour they describe; code and the words a person reads may not.
# The composition root is one of them: a front end is passed in, never named (an
# ``import_module("gpubot.slack...")`` would dodge the import rule, not this one).
SHARED = ("core", "services", "store", "chat", "config", "transport", "app")
SHARED_FILES = ("errors.py", "metrics.py", "metrics_claims.py", "scheduler.py")
FRONT_ENDS = {"slack", "matrix"}  # Slack's libraries (slack_sdk, slack_bolt) spell it too
# Names where "slack" is English (a tolerance of the clock), not the chat system.
NOT_A_FRONT_END = {"TIME_SLACK_S", "START_SLACK_S"}
DOC_OWNERS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def front_end_names(module: ast.Module) -> list[tuple[int, str]]:
    """Return (line, text) of each identifier and string, docstrings aside, that names a
    front end."""
    docs = {
        id(n.body[0].value)
        for n in ast.walk(module)
        if isinstance(n, DOC_OWNERS) and n.body and isinstance(n.body[0], ast.Expr)
    }
    out = []
    for node in ast.walk(module):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = None if id(node) in docs else node.value
        elif isinstance(node, ast.alias):
            text = node.asname or node.name
        else:
            text = getattr(node, "id", None) or getattr(node, "attr", None)
            text = text or getattr(node, "arg", None) or getattr(node, "name", None)
        words = _words(text) if isinstance(text, str) else set()
        if words & FRONT_ENDS and text not in NOT_A_FRONT_END:
            out.append((getattr(node, "lineno", 0), str(text)))
    return sorted(out)


def _words(text: str) -> set[str]:
    """Return the lower-case words of ``text``, camel case split (``postToSlack``)."""
    return set(re.split(r"[^a-z]+", re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", text).lower()))


@pytest.mark.parametrize(
    "path",
    [p for s in SHARED for p in _files(s)] + [PKG / f for f in SHARED_FILES],
    ids=lambda p: p.relative_to(PKG).as_posix(),
)
def test_the_shared_layers_name_no_front_end(path: Path) -> None:
    assert front_end_names(tree(path)) == []


def test_the_front_end_check_sees_names_and_words_but_no_docstring() -> None:
    module = ast.parse(
        '"""Slack\'s limits."""\n'
        'def f(source, slack=None):\n    """Slack says so."""\n'
        '    if source == "slack":\n        return slack_users_of(x, "SLACK_BOT_TOKEN unset")\n'
        "TIME_SLACK_S = 1\nimport slack_sdk\n"
    )
    assert front_end_names(module) == [
        (2, "slack"),
        (4, "slack"),
        (5, "SLACK_BOT_TOKEN unset"),
        (5, "slack_users_of"),
        (7, "slack_sdk"),
    ]


@pytest.mark.parametrize(
    "source",
    [
        "def postToSlack(m):\n    pass",
        "class SlackUser:\n    pass",
        'api = importlib.import_module("gpubot.slack.api")',
        'front = __import__("gpubot.slack", fromlist=["x"])',
        "x = settings.chat.slackChannel",
    ],
)
def test_control_the_front_end_check_sees_camel_case_and_module_strings(source: str) -> None:
    assert front_end_names(ast.parse(source)) != []
