"""The checkers behind the layer rules, each shown catching what it is for (tests/import_graph.py,
tests/unit/test_layers.py): a rule that passes because its checker sees nothing proves nothing."""

from __future__ import annotations

import ast
import textwrap

from tests.fixtures.code_rules import fmt_skips_without_a_why, slack_vocabulary
from tests.import_graph import climbs, cycles, imports_of, mermaid, readme_drawing

KNOWN = frozenset({"gpubot.services.reset", "gpubot.services.reset_run", "gpubot.core.models"})


def _imports(src: str, here: str = "gpubot.services.reset_run") -> set[str]:
    return imports_of(ast.parse(textwrap.dedent(src)), here, False, KNOWN)


def test_an_import_under_type_checking_or_in_a_function_counts() -> None:
    src = """
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from gpubot.services.reset import ResetService
        def f():
            from gpubot.core import models
    """
    assert {"gpubot.services.reset", "gpubot.core.models"} <= _imports(src)


def test_a_relative_import_is_resolved() -> None:
    assert "gpubot.services.reset" in _imports("from .reset import ResetService")
    assert "gpubot.core.models" in _imports("from ..core.models import NodeSnapshot")


def test_from_a_package_import_a_module_is_that_module_only() -> None:
    assert _imports("from gpubot.core import models") == {"gpubot.core.models"}
    assert _imports("from gpubot.core import models, NAME") == {"gpubot.core.models", "gpubot.core"}


def test_a_cycle_hidden_three_modules_deep_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_an_import_that_climbs_or_crosses_a_layer_is_found() -> None:
    graph = {
        "gpubot.slack.serve": {"gpubot.app", "gpubot.chat.flows"},
        "gpubot.services.sweep": {"gpubot.chat.alerts", "gpubot.core.models"},
        "gpubot.store.engine": {"gpubot.transport.ssh"},
        "gpubot.app": {"gpubot.slack.serve"},
    }
    assert climbs(graph) == [
        ("gpubot.services.sweep", "gpubot.chat.alerts"),
        ("gpubot.slack.serve", "gpubot.app"),
        ("gpubot.store.engine", "gpubot.transport.ssh"),
    ]


def test_the_drawing_has_one_arrow_per_pair_of_layers() -> None:
    graph = {"gpubot.app": {"gpubot.slack.a", "gpubot.slack.b"}, "gpubot.slack.a": set()}
    assert list(mermaid(graph)) == ["graph TD", "  app --> slack"]


def test_slack_vocabulary_is_seen() -> None:
    src = """
        SLACK_USER = "x"
        blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "<@U0BOB> at <!date^1>"}}]
        element = {"action_id": "approve"}
        neutral = {"type": "table", "title": "GPUs"}
    """
    found = {what for _, what in slack_vocabulary(ast.parse(textwrap.dedent(src)))}
    assert found == {
        "Slack name SLACK_USER",
        "Block Kit type 'section'",
        "Block Kit type 'mrkdwn'",
        "Slack token '<@'",
        "Slack token '<!date^'",
        "Block Kit key 'action_id'",
    }


def test_a_fmt_skip_needs_a_reason() -> None:
    src = textwrap.dedent("""
        a = [1,2]  # fmt: skip
        # why: the table reads as a grid
        b = [1,2]  # fmt: skip
        c = [1,2]  # fmt: skip  # why: it mirrors the spec's layout
        d = "# fmt: skip in a string is no marker"
    """)
    assert fmt_skips_without_a_why(src) == [2]


def test_the_readme_drawing_is_read_from_its_mermaid_block() -> None:
    readme = "# x\n```mermaid\ngraph TD\n  app --> slack\n```\ntext\n"
    assert readme_drawing(readme) == ["graph TD", "  app --> slack"]
    assert readme_drawing("no drawing") == []
