"""Issue 21, hostile case 5: no name a node user controls formats, links or forges a line in any
renderer: the approval request, plans and outcomes, status, alerts, the idle DM, the Home tab,
audit views, head publications, errors, and the console and CLI text.

The inputs are real parses (``tests/hostile_render.py``): a Slurm job named
``x` *pre-approved by on-call* `y``, a container, image and labels, argv, comm, an LDAP user
name, a node's note and a failing node's reason, each with back-ticks, ``*``, ``_``, ``~``,
``<``, ``>``, ``&``, newlines and terminal escape sequences. The controls remove the escaping
and show the attack: the on-call message then says *pre-approved by on-call* in bold.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpubot.chat import alert_digest, alerts, fleet_view, heads, home, idle, reset_view
from gpubot.chat.alerts import snooze_buttons
from gpubot.chat.errors import error_message
from gpubot.chat.message import Mention, Message
from gpubot.cli import render as cli_render
from gpubot.cli import sweep as cli_sweep
from gpubot.console import text_render
from gpubot.console.repl import render as console_render
from gpubot.core import text as core_text
from gpubot.core import text_table
from gpubot.core.alerting import AlertGroup, AlertItem, MessageRef, SweepResult
from gpubot.core.findings import IDLE_HOLDER, NODE_UNREACHABLE, NodeFailure, SweepConfig, find
from gpubot.core.models import ResetStep
from gpubot.core.reset.outcome import GpuObservation, GpuResult, Newcomer, Survivor, classify
from gpubot.core.reset.plan import ResetPlan, ResetRequest, plan_reset
from gpubot.core.reset.protect import Protection
from gpubot.core.reset.readiness import Readiness
from gpubot.core.text import code
from gpubot.errors import UsageError
from gpubot.services.reset import ResetResult
from gpubot.services.reset_run import ResetEvent
from gpubot.services.status import FleetStatus
from gpubot.slack import blockkit, mrkdwn
from tests import hostile_render as h
from tests.fixtures.slack_render import bk, slack

fv, rv = fleet_view, reset_view
render_home, render_refused_home = home.render_home, home.render_refused_home
render_alert_group, render_reminder = alerts.render_alert_group, alerts.render_reminder
render_digest_details = alert_digest.render_digest_details
render_sweep, render_head, render_idle_dm = (
    alerts.render_sweep,
    heads.render_head,
    idle.render_idle_dm,
)
ASKED = ("Requested by ", Mention("U0DAVE"))

AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def plan() -> ResetPlan:
    return plan_reset(h.snapshot(), ResetRequest("node1", "dave", gpus=(0, 1, 2)), Protection())


def result() -> ResetResult:
    p, snap = plan(), h.snapshot()
    slurm = snap.processes[0]
    new = Newcomer(
        4250, "alice", slurm.command or "", 4242, slurm.command, "slurm:4242", slurm.workload
    )
    observed = (
        GpuObservation(0, 30_000, False, newcomers=(new,), holders=1),
        GpuObservation(1, 30_000, False, survivors=(Survivor(4343, "D", h.COMM),), holders=1),
        GpuObservation(2, None, False, error=h.NOTE),
    )
    gpus = []
    for obs in observed:
        outcome, detail = classify(obs, 0, 1024)
        gpus.append(GpuResult(obs.index, outcome, detail, 30_000, obs.memory_after_mib, None))
    steps = (ResetEvent(ResetStep.PLANNED, 1.0, {"gpus": [0, 1, 2], "targets": [4242]}),)
    return ResetResult("node1", p, tuple(gpus), steps, snap, snap, 7)


def sweep() -> SweepResult:
    snap = h.snapshot()
    failed = {"node2": NodeFailure(NODE_UNREACHABLE, h.FAILED)}
    idle = {("node1", 0): 6 * 3600.0, ("node1", 1): 6 * 3600.0}
    # every holder has held its GPU for as long as the GPU has been idle (core.usage.holder_runs)
    held = {(snap.node, p.gpu_index, f"{p.pid}:{p.start_ticks}"): 0.0 for p in snap.processes}
    findings = find([snap], failed, SweepConfig(), idle=idle, held=held)
    ready = Readiness(
        0, tuple(p.command or "" for p in snap.processes), h.NOTE, None, h.NOTE, None, None
    )
    return SweepResult(
        NOW_TS, 1.5, ("node1", "node2"), (snap,), failed, (), findings, {("node1", 0): ready}
    )


NOW_TS = AT.timestamp()


def alert_group() -> AlertGroup:
    items = [AlertItem(f.key, f, AT - timedelta(hours=7)) for f in sweep().findings]
    items.append(AlertItem(items[0].key, items[0].finding, AT - timedelta(hours=9), AT))
    return AlertGroup("node1", tuple(items), h.snapshot(), AT)


def digest_group() -> AlertGroup:
    """The alert group's findings on node1 and node3: one digest across both."""
    items = alert_group().items
    elsewhere = [replace(i, key=i.key._replace(node="node3")) for i in items]
    return AlertGroup("findings on 2 nodes", (*items, *elsewhere), None, AT)


@dataclass
class Action:
    """An audit summary as the store gives it; who and what come from a chat user's typing."""

    id: int
    actor: str = f"U0EVE `*{h.ATTACK}*`"
    source: str = "slack"
    command: str = f"/gpu reset node1 `*{h.ATTACK}*` <!channel>"
    node: str = "node1"
    gpus: tuple[int, ...] = (0,)
    status: str = "freed"
    started_at: datetime = AT


@dataclass
class Head:
    ok: bool
    head: str = "42:" + "a" * 64
    head_seq: int = 42
    checked: int = 42

    def line(self) -> str:
        return "record 7 does not verify"  # gpubot's own words: they are shown in bold

    def mode_text(self) -> str:
        return "keyed"


def neutral_messages() -> dict[str, Message]:
    """Every chat renderer's message (or view) for the hostile inputs."""
    p, res, snap = plan(), result(), h.snapshot()
    failed = {"node2": h.FAILED}
    many = [snap, h.snapshot("node3"), h.snapshot("node4"), h.snapshot("node5")]
    events = [ResetEvent(ResetStep.PLANNED, 1.0, {"gpus": [0], "targets": [4242]})]
    events += [ResetEvent(ResetStep.GPU_OUTCOME, 2.0, g.to_dict()) for g in res.gpus]
    group = alert_group()
    idle_items = [i for i in group.items if i.key.kind == IDLE_HOLDER.value]
    note = f"⚠ could not post: `gpubot console --as X`, then `approve 1` {h.NOTE}"
    msgs: dict[str, Message] = {
        "approval request": rv.render_approval_request(12, p, "U0DAVE", "dave", NOW_TS + 900),
        "approval state": rv.render_approval_state(
            12, p, "U0DAVE", "dave", reset_view.Decision("pending", None, NOW_TS), note=note
        ),
        "progress": rv.render_progress("Reset node1", ASKED, p, events),
        "result": rv.render_result("Reset node1", ASKED, res),
        "result as text": rv.render_result("Reset node1", ("x",), res, use_table=False),
        "audit": rv.render_audit([Action(i) for i in range(3)], node="node1"),
        "node": fv.render_node(snap),
        "node as text": fv.render_node(snap, use_table=False),
        "few nodes": fv.render_fleet([snap, h.snapshot("node3")], failed, seconds=1.0),
        "many nodes": fv.render_fleet(many, failed, seconds=1.0),
        "alert group": render_alert_group(group),
        "reminder": render_reminder(group),
        "sweep": render_sweep(sweep()),
        "idle DM": render_idle_dm(
            idle_items,
            "node1",
            now=AT,
            alert=MessageRef("C0ALERT/1.2"),
            snooze=lambda k: snooze_buttons(k)[1],
        ),
        "home": render_home(
            "U0EVE",
            h.LDAP_USER,
            many,
            failed,
            seconds=1.0,
            now=NOW_TS,
            idle_hours={h.LDAP_USER: 2.5, "alice": 1.0},
        ),
        "refused home": render_refused_home("U0EVE", h.NOTE, now=NOW_TS),
        "head": render_head(Head(True), AT),
        "head that may repeat": render_head(Head(True), AT, AT),
        "digest details": render_digest_details(digest_group())[0],
        "failed head": render_head(Head(False), AT),
        "error": error_message(UsageError(f"no node named {h.JOB!r} {h.NOTE}")),
    }
    return msgs


def messages() -> dict[str, Any]:
    """Every Slack payload for the hostile inputs (and Slack's fallbacks of four)."""
    msgs = {k: slack(m) for k, m in neutral_messages().items()}
    for name in ("approval request", "node", "sweep", "alert group"):
        msgs[f"{name}, text only"] = bk.text_form(msgs[name])
        msgs[f"{name}, without tables"] = bk.without_tables(msgs[name]) or msgs[name]
    return msgs


def terminal_texts() -> dict[str, str]:
    """Every console and CLI text for the hostile inputs."""
    out = {f"console: {k}": console_render(m) for k, m in neutral_messages().items()}
    status = FleetStatus((h.snapshot(),), {"node2": h.FAILED}, 1.0)
    for color in (False, True):
        out[f"status (color {color})"] = cli_render.render_fleet(status, color=color)
        out[f"reset (color {color})"] = cli_render.render_reset(result(), color=color)
    out["plan"] = "\n".join(cli_render.render_plan_lines(plan()))
    out["sweep"] = cli_sweep.render(sweep())
    return out


def test_the_hostile_names_reach_every_renderer() -> None:
    """No check below is vacuous: each message and text carries a name's words."""
    for name, msg in messages().items():
        if "head" not in name and name != "reminder":  # these carry no node user's name
            assert any(w in str(msg) for w in h.HOSTILE_WORDS), name
    for name, text in terminal_texts().items():
        if "reminder" not in name and "head" not in name:
            assert h.ATTACK[:12] in text, name
    assert any(p.workload and p.workload.name == h.JOB for p in h.snapshot().processes)


@pytest.mark.parametrize("name", sorted(messages()))
def test_no_name_formats_links_or_forges_a_line_in_slack(name: str) -> None:
    msg = messages()[name]
    assert h.message_problems(msg) == []
    assert bk.limit_problems(msg, view=msg.get("type") == "home") == []


def test_the_approval_request_keeps_the_job_name_in_one_code_span() -> None:
    text = next(t for k, t in h.texts(messages()["approval request"]) if "asks to free" in t)
    job = "`x\u02cb *" + h.ATTACK + "* \u02cby`"
    assert f"job name {job}" in text  # the whole name, its back-ticks as ˋ, in one span
    assert "processes of `alice`, `bob`, `eve\\x0a" in text  # owners in spans, one line each


@pytest.mark.parametrize("name", sorted(terminal_texts()))
def test_no_name_forges_a_line_or_drives_the_terminal(name: str) -> None:
    assert h.terminal_problems(terminal_texts()[name]) == []


def test_the_console_shows_the_real_characters() -> None:
    text = console_render(neutral_messages()["approval request"])
    assert f"job name `x\u02cb *{h.ATTACK}* \u02cby`" in text  # the name's own characters
    assert "\u2217" not in text and "&lt;" not in text and "<!channel> & <@U0BOSS>" in text


# --- the checker itself, and the controls --------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (f"It kills job name `x` *{h.ATTACK}* `y`.", "formats a name's words"),
        ("owner: `a` _itsfine_", "formats a name's words"),
        ("`x` ~struck~ here", "formats a name's words"),
        ("open `span", "odd number of back-ticks"),
        ("hi <!channel>", "a raw < or >"),
        ("a & b", "a bare &"),
        ("```\nx ` y\n```", "a back-tick inside a block"),
        ("```\nunclosed", "not closed"),
        ("&gt; quoted", "a block quote"),
        (f"ok\n{h.FORGED}", "a forged line"),
    ],
)
def test_the_checker_sees_each_attack(text: str, want: str) -> None:
    assert any(want in p for p in h.mrkdwn_problems(text)), h.mrkdwn_problems(text)


def test_the_checker_passes_what_gpubot_means() -> None:
    ok = "⚠ *node1: orphaned memory* <@U0A> <!date^1^{date}|x> &amp; `a*b*` ```\n*x*\n```"
    assert h.mrkdwn_problems(ok) == []


def _no_escaping(monkeypatch: pytest.MonkeyPatch, *, core: bool, chat: bool) -> None:
    def same(text: str) -> str:
        return text

    if core:  # names written in back-ticks as they are
        monkeypatch.setattr(core_text, "code", lambda s: f"`{s}`")
    if chat:  # mrkdwn escaping and one-line writing gone
        for name in ("_PLAIN", "_CODE"):
            monkeypatch.setattr(mrkdwn, name, {})
        for module in (mrkdwn, blockkit, text_render, text_table, cli_render, cli_sweep):
            monkeypatch.setattr(module, "one_line", same)


def test_control_without_escaping_the_job_name_bolds_pre_approved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _no_escaping(monkeypatch, core=True, chat=True)
    msg = messages()["approval request"]
    problems = h.message_problems(msg)
    assert f"* formats a name's words: '*{h.ATTACK}*'" in problems
    assert any("forged line" in p for p in problems)
    assert any("a raw < or >" in p for p in problems)


def test_control_without_escaping_the_terminal_gets_forged_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _no_escaping(monkeypatch, core=True, chat=True)
    found = {k: h.terminal_problems(t) for k, t in terminal_texts().items()}
    for name in ("status (color False)", "plan", "sweep", "console: approval request"):
        assert found[name], name


@pytest.mark.parametrize(("core", "chat"), [(True, False), (False, True)])
def test_control_each_layer_is_needed(
    monkeypatch: pytest.MonkeyPatch, core: bool, chat: bool
) -> None:
    """Without core's marking the renderer still formats nothing; without the renderer's
    escaping, core's marking alone leaves other names free (the idle DM, the tables' text)."""
    _no_escaping(monkeypatch, core=core, chat=chat)
    bad = {k: h.message_problems(m) for k, m in messages().items()}
    if chat:
        assert bad["idle DM"] and bad["node as text"] and bad["alert group"]
    else:
        assert not any(bad.values()), {k: v for k, v in bad.items() if v}
        text = next(t for k, t in h.texts(messages()["approval request"]) if "asks" in t)
        assert "`x`" in text  # the name's own back-tick now ends the span: only escaping saves it


@pytest.mark.parametrize(
    ("render", "text", "want"),
    [
        (code, "a`b\nc", "`aˋb\\x0ac`"),
        (bk.code, "a`b<&>", "`aˋb&lt;&amp;&gt;`"),
        (bk.code, "", "–"),
        (bk.escape, "*a* _b_ ~c~ `d`", "∗a∗ ˍbˍ ∼c∼ ˋdˋ"),
        (
            bk.escape,
            "gpu_node_1 x_ _y a__b",
            "gpu_node_1 xˍ ˍy aˍˍb",
        ),  # only a word's inner _ stays
        (bk.escape, "> q\nr", "\u00ad&gt; q\\x0ar"),
        (bk.code_safe, "x```y *z*", "xˋˋˋy *z*"),
        (bk.mrkdwn, "kills `a*b*` and *c*", "kills `a*b*` and ∗c∗"),
        (bk.mrkdwn, "odd ` tick `x` y", "odd ` tick `xˋ y"),  # the unmatched one is text
    ],
)
def test_the_escapers(render: Callable[[str], str], text: str, want: str) -> None:
    assert render(text) == want
