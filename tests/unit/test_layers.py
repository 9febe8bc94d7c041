"""The design's layering, checked by walking imports.

Every file is parsed once per run (``tests.import_graph.tree``), whatever number of rules read it.
"""

from __future__ import annotations

import ast
import importlib
import itertools
import re
import sys
from pathlib import Path

import pytest

from tests.fixtures.code_rules import fmt_skips_without_a_why, slack_vocabulary
from tests.import_graph import (
    PKG,
    climbs,
    cycles,
    imported,
    imports_of,
    mermaid,
    module_graph,
    module_name,
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
        if rel.startswith("app/"):
            continue
        for node in ast.walk(tree(path)):
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
    bad = _imports_of("slack") + _imports_of("console")
    assert [(f, m) for f, m in bad if _is(m, "gpubot.app")] == []


def test_the_composition_root_is_one_package_that_names_no_front_end() -> None:
    """The root is ``gpubot/app/`` (modules by meaning, not ``app_*.py`` cut to a size); a
    front end is passed in by the entry that chose it, so the root imports none."""
    assert sorted(p.name for p in PKG.glob("app*.py")) == []
    fronts = ("gpubot.slack", "gpubot.console", "slack_bolt", "slack_sdk")
    root = _imports_of("app") + _imports_of("lifecycle.py")
    assert root and [(f, m) for f, m in root if _is(m, *fronts)] == []
    # The control: an import of Slack is seen where the root would hold one.
    control = imports_of(
        ast.parse("from gpubot.slack.api import SlackApi"), "gpubot.app", True, frozenset()
    )
    assert [m for m in control if _is(m, *fronts)] == ["gpubot.slack.api"]


def _late_sets(module: ast.Module) -> list[int]:
    """Return the lines that set an attribute of another object than ``self``."""
    bad = []
    for node in ast.walk(module):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Attribute) and not (
                isinstance(t.value, ast.Name) and t.value.id == "self"
            ):
                bad.append(t.lineno)
    return bad


def test_the_composition_root_builds_complete_objects() -> None:
    """Each object gets what it needs when it is made: no ``obj.attr = ...`` after it."""
    assert [(p.name, n) for p in _files("app") for n in _late_sets(tree(p))] == []
    control = "app.parts = wire_parts(app)\nreset.after_forced = seals.forced\nself.store = s"
    assert _late_sets(ast.parse(control)) == [1, 2]  # the root's old setters are seen


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
    ],
)
def test_control_the_durations_rule_sees_the_old_grammars(source: str) -> None:
    assert duration_code(ast.parse(source)) != []


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


def test_core_is_grouped_by_feature() -> None:
    """A prefix shared by several core modules is a feature package waiting to be made."""
    top = sorted(p.stem for p in (PKG / "core").glob("*.py") if p.stem != "__init__")
    assert len(top) <= 30, top
    prefixes = {name.split("_")[0] for name in top if "_" in name}
    packages = {p.name for p in (PKG / "core").iterdir() if (p / "__init__.py").exists()}
    crowded = sorted(
        pre for pre in prefixes if sum(n.split("_")[0] == pre for n in top) >= 3 or pre in packages
    )
    assert crowded == [], f"group these into core/<feature>/: {crowded}"


# --- one extension style: explicit lists a person reads (runtimes, finding kinds) ---------------


def test_core_finds_no_module_by_scanning() -> None:
    """Runtimes and finding kinds are named in lists (``core.runtimes``, ``core.health.kinds``):
    nothing in core imports modules it found at run time."""
    bad = [(p.name, m) for p in _files("core") for m in _imports(p) if _is(m, "pkgutil")]
    bad += [(p.name, c) for p in _files("core") for _, c in _calls(p) if "import_module" in c]
    assert bad == []


def _bound(path: Path, cls: str) -> list[str]:
    """Return the names bound at module level in ``path`` to a call of ``cls``."""
    return [
        t.id
        for node in tree(path).body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == cls
        for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(t, ast.Name)
    ]


def _values(cls: str) -> list[tuple[str, object]]:
    """Return ``(module.NAME, value)`` of every module-level ``NAME = cls(...)`` in gpubot."""
    out = []
    for path in sorted(PKG.rglob("*.py")):
        names = _bound(path, cls)
        if names:
            mod = importlib.import_module(module_name(path))
            out += [(f"{mod.__name__}.{n}", getattr(mod, n)) for n in names]
    return out


def test_every_runtime_and_finding_kind_is_in_its_list() -> None:
    from gpubot.core.health.kinds import KINDS
    from gpubot.core.runtimes import RUNTIMES

    for cls, listed in (("Runtime", RUNTIMES), ("FindingKind", KINDS)):
        found = _values(cls)
        assert [n for n, v in found if not any(v is x for x in listed)] == [], cls
        assert len(found) == len(listed), cls  # and nothing is listed that no module declares
    for path in sorted(PKG.rglob("*.py")):  # no value made anywhere but in a module's own name
        made = [
            n.lineno
            for n in ast.walk(tree(path))
            if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Name)
            and n.func.id in ("Runtime", "FindingKind")
        ]
        assert len(made) == len(_bound(path, "Runtime") + _bound(path, "FindingKind")), path


def kind_tables(module: ast.Module, kinds: set[str]) -> list[int]:
    """Return the lines of each collection display (set, tuple, list, dict keys) that names two
    finding kinds or more: a table of kinds, which only the list may hold."""
    out = []
    for node in ast.walk(module):
        if isinstance(node, ast.Dict):
            items: list[ast.expr | None] = list(node.keys)
        elif isinstance(node, ast.Set | ast.Tuple | ast.List):
            items = list(node.elts)
        else:
            continue
        named = [
            n.id if isinstance(n, ast.Name) else n.attr
            for n in items
            if isinstance(n, ast.Name | ast.Attribute)
        ]
        if sum(name in kinds for name in named) >= 2:
            out.append(node.lineno)
    return out


def _kind_names() -> set[str]:
    return {n.rsplit(".", 1)[1] for n, _ in _values("FindingKind")}


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
        and n.value in names
    ]


def test_adding_a_runtime_touches_its_module_the_list_and_its_test() -> None:
    """Outside core/runtimes/ nothing names a runtime: doctor's sudo rule, config validation and
    the rest read the runtimes' own values."""
    files = [p for p in sorted(PKG.rglob("*.py")) if "runtimes" not in p.parts]
    assert [(p.name, s) for p in files for s in runtime_names_in(tree(p))] == []


def test_control_the_runtime_rule_sees_a_table_of_runtimes() -> None:
    old = 'STOP_OF = {"docker": "docker", "podman": "podman", "slurm": "scancel"}'
    assert sorted(set(runtime_names_in(ast.parse(old)))) == ["docker", "podman", "scancel", "slurm"]


def outbox_modules(paths: list[str]) -> list[str]:
    """Return the package files (relative paths) named for an outbox or for posts kept once."""
    return sorted(p for p in paths if "outbox" in Path(p).stem or "_posts" in Path(p).stem)


def post_tables(tables: dict[str, set[str]]) -> list[str]:
    """Return the tables (name → columns) that hold a post's token and its state."""
    return sorted(name for name, cols in tables.items() if {"token", "state"} <= cols)


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
    assert post_tables(tables) == ["alert_posts", "approval_posts", "usage_digests"]


# The shared layers name no front end: a second one is added without editing them. Docstrings
# may say whose behaviour they describe; code and the words a person reads may not.
SHARED = ("core", "services", "store", "chat", "config")
FRONT_ENDS = {"slack"}  # its libraries (slack_sdk, slack_bolt) spell it too
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
        words = set(re.split(r"[^a-z]+", text.lower())) if isinstance(text, str) else set()
        if words & FRONT_ENDS and text not in NOT_A_FRONT_END:
            out.append((getattr(node, "lineno", 0), str(text)))
    return sorted(out)


@pytest.mark.parametrize(
    "path", [p for s in SHARED for p in _files(s)], ids=lambda p: p.relative_to(PKG).as_posix()
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
