"""Block Kit renderings: content, escaping, and every Slack limit on small and huge fleets."""

from __future__ import annotations

import json
import re

import pytest

from gpubot.chat import alerts, fleet_view, home, reset_view
from gpubot.chat.message import Mention
from gpubot.console.text_render import text_of
from gpubot.core.models import NodeSnapshot, ResetStep
from gpubot.core.reset.plan import ResetRequest, plan_reset
from gpubot.core.reset.protect import Protection
from gpubot.services.reset import ResetEvent
from tests.fixtures.fleet_samples import EVIL, big_fleet, gpu, plan_and_result, proc, snap
from tests.fixtures.slack_render import bk, orphaned_alert, view, views

fv = views(fleet_view)
rb = rv = views(reset_view)
ra = views(alerts)
render_home = view(home.render_home)


def all_text(msg: dict[str, object]) -> str:
    return json.dumps(msg, ensure_ascii=False)


def test_one_node_is_a_table() -> None:
    msg = fv.render_node(snap())
    assert bk.limit_problems(msg) == []
    tables = [b for b in msg["blocks"] if b["type"] == "table"]
    assert len(tables) == 1
    rows = [[c["text"] for c in r] for r in tables[0]["rows"]]
    head = ["GPU", "Memory", "Util", "Processes (owner pid MiB workload command)", "Flags"]
    assert rows[0] == head
    assert rows[1][:3] == ["0", "2048 / 81920 MiB", "50 %"]
    assert "alice 4242 1024 MiB python train.py --run 4242" in rows[1][3]
    assert rows[2][4] == "hidden"  # dave holds GPU 1's device file, unlisted by nvidia-smi
    assert rows[3][4] == "no-process-memory"
    assert rows[4][1] == "? / 81920 MiB" and "memory-unknown" in rows[4][4]
    assert "zombie" in rows[4][4]
    assert msg["text"] == "node1: 4 GPUs, 3 busy, 1 idle, 3 flagged"


def test_a_gpu_whose_device_file_is_unknown_is_flagged() -> None:
    s = snap()
    s = NodeSnapshot(s.node, s.taken_at, (*s.gpus, gpu(4, 0, minor=None)), s.processes)
    msg = fv.render_node(s)
    assert bk.limit_problems(msg) == []
    rows = [
        [c["text"] for c in r] for b in msg["blocks"] if b["type"] == "table" for r in b["rows"]
    ]
    assert rows[5][0] == "4" and rows[5][4] == "device-file-unknown"
    assert all("device-file-unknown" not in r[4] for r in rows[1:5])  # minors known, not = index
    assert msg["text"] == "node1: 5 GPUs, 3 busy, 2 idle, 4 flagged"
    plain = bk.message_text(fv.render_node(s, use_table=False))
    assert "device-file-unknown" in plain
    fleet = bk.message_text(fv.render_fleet([s], {}, seconds=1.0))
    assert "device-file-unknown" in fleet


def test_mrkdwn_is_escaped_but_table_cells_are_raw() -> None:
    msg = fv.render_node(snap(), use_table=False)
    text = all_text(msg)
    assert "<!channel>" not in text and "<@U0BOSS>" not in text
    assert "&lt;!channel&gt; &amp; &lt;@U0BOSS&gt;" in text
    assert "```rm" not in text  # back-ticks cannot close the preformatted block
    assert bk.limit_problems(msg) == []
    plain = bk.message_text(msg)
    assert "<!channel> & <@U0BOSS>" in plain  # the console shows the real text


def test_fallback_when_the_table_would_not_fit() -> None:
    many = NodeSnapshot("wide", 0.0, tuple(gpu(i, 10) for i in range(150)))
    msg = fv.render_node(many)
    assert not any(b["type"] == "table" for b in msg["blocks"])
    assert bk.limit_problems(msg) == []
    assert re.search(r"(?m)^149  10 / 81920 ", bk.message_text(msg))


def test_few_nodes_show_every_gpu() -> None:
    msg = fv.render_fleet([snap("a"), snap("b")], {"c": "connection refused"}, seconds=1.5)
    assert bk.limit_problems(msg) == []
    text = bk.message_text(msg)
    assert "Nodes: 2 OK, 1 failing" in text
    assert "c: connection refused" in text
    assert "alice 4242" in text and re.search(r"(?m)^  3  ", text)


@pytest.mark.parametrize("use_table", [True, False])
def test_256_node_fleet_fits_every_limit(use_table: bool) -> None:
    fleet = big_fleet()
    failed = {f"dead{i:03d}": "ssh: connection refused " + "y" * 200 for i in range(40)}
    msg = fv.render_fleet(fleet, failed, seconds=3.2, use_table=use_table)
    assert bk.limit_problems(msg) == []
    assert len(msg["blocks"]) <= 50
    assert sum(b["type"] == "table" for b in msg["blocks"]) == (1 if use_table else 0)
    text = bk.message_text(msg)
    assert "256 OK, 40 failing" in text
    assert "more flagged GPU(s)" in text  # details are cut, and it says so
    assert "<!channel>" not in all_text(msg)
    for s in fleet[:3]:  # each node's own answer fits too
        assert bk.limit_problems(fv.render_node(s)) == []


def test_huge_failures_only() -> None:
    failed = {f"n{i}": "timeout " * 50 for i in range(1000)}
    msg = fv.render_fleet([], failed)
    assert bk.limit_problems(msg) == []
    assert "more failing node(s)" in bk.message_text(msg)


def test_limit_checker_catches_breakage() -> None:
    bad = {
        "text": "x" * 5000,
        "blocks": [bk.section("ok")] * 51
        + [
            {"type": "section", "text": {"type": "mrkdwn", "text": "y" * 3001}},
            {"type": "header", "text": {"type": "plain_text", "text": "h" * 151}},
            bk.table([["a"]] * 101),
            bk.table([["b"] * 21]),
        ],
    }
    problems = " | ".join(bk.limit_problems(bad))
    for want in (
        "blocks > 50",
        "text of 5000",
        "section text > 3000",
        "header > 150",
        "table of 101 rows",
        "table of 1 rows",
        "2 table blocks",
    ):
        assert want in problems


def test_reset_progress_and_result() -> None:
    res = plan_and_result()
    events = [
        ResetEvent(ResetStep.PLANNED, 1.0, {"gpus": [0], "targets": [4242, 4243], "forced": True}),
        ResetEvent(ResetStep.SIGNAL, 1.1, {"pid": 4242, "signal": "SIGTERM", "result": "sent"}),
        ResetEvent(ResetStep.SIGNAL, 1.1, {"pid": 4243, "signal": "SIGTERM", "result": "sent"}),
        ResetEvent(ResetStep.EXITED, 1.5, {"pid": 4242}),
        ResetEvent(ResetStep.VERIFYING, 2.0, {"gpus": [0]}),
    ]
    prog = rb.render_progress(
        "Reset node1 · GPU 0", ("Requested by ", Mention("U0ALICE")), res.plan, events
    )
    assert bk.limit_problems(prog) == []
    text = bk.message_text(prog)
    for want in (
        "planned: 2 process(es) on GPU 0",
        "SIGTERM: 2 sent",
        "exited: 1",
        "verifying GPU 0",
        "Requested by @U0ALICE",
    ):
        assert want in text
    events.append(ResetEvent(ResetStep.GPU_OUTCOME, 3.0, res.gpus[0].to_dict()))
    assert "GPU 0: freed in 1.2 s" in "\n".join(text_of(t) for t in rb.step_lines(events))

    done = rb.render_result("Reset node1", ("Requested by ", Mention("U0ALICE")), res)
    assert bk.limit_problems(done) == []
    rows = [
        [c["text"] for c in r] for b in done["blocks"] if b["type"] == "table" for r in b["rows"]
    ]
    assert rows[0] == ["GPU", "Before", "After", "Outcome", "Freed in"]
    assert rows[1] == ["0", "2048 MiB · alice, bob", "0 MiB", "✅ freed", "1.2 s"]
    assert "audit #17" in bk.message_text(done)

    stuck = rb.render_result("Reset node1", ("by x",), plan_and_result(ok=False), use_table=False)
    assert bk.limit_problems(stuck) == []
    assert "GPU 0: stuck — pid 4243 survived SIGKILL" in bk.message_text(stuck)
    assert "NOT all freed" in stuck["blocks"][0]["text"]["text"]


def test_approval_request_and_decision() -> None:
    plan = plan_and_result().plan
    msg = rb.render_approval_request(12, plan, "U0BOB", "bob", 1_700_000_900.0)
    assert bk.limit_problems(msg) == []
    actions = next(b for b in msg["blocks"] if b["type"] == "actions")["elements"]
    assert [(a["action_id"], a["value"]) for a in actions] == [
        (rb.ACTION_APPROVE, "12"),
        (rb.ACTION_DENY, "12"),
    ]
    assert "confirm" in actions[0] and "confirm" not in actions[1]
    text = bk.message_text(msg)
    assert "@U0BOB (bob) asks to free node1 GPU 0" in text
    assert "kills processes of `alice`, `bob`: 2 process(es), 2048 MiB" in text
    assert "Request #12" in text and "2023-11-14 22:28:20 UTC" in text

    decided = rb.render_approval_state(
        12, plan, "U0BOB", "bob", reset_view.Decision("denied", "U0CAROL", 1_700_000_100.0)
    )
    assert bk.limit_problems(decided) == []
    assert not any(b["type"] == "actions" for b in decided["blocks"])
    assert "Denied by @U0CAROL" in bk.message_text(decided)

    res = plan_and_result()
    body = reset_view.render_result("Reset node1", ("x",), res)
    done = rb.render_approval_state(
        12, plan, "U0BOB", None, reset_view.Decision("executed", "U0CAROL", 1.0), body=body
    )
    assert bk.limit_problems(done) == []
    assert "no known Linux user" in bk.message_text(done)
    assert "✅ freed" in bk.message_text(done)


def test_approval_of_a_huge_plan_fits() -> None:
    procs = tuple(proc(1000 + i, i % 8, f"u{i}", command=EVIL * 20) for i in range(500))
    s = NodeSnapshot("n", 0.0, tuple(gpu(i, 5000) for i in range(8)), procs)
    plan = plan_reset(s, ResetRequest("n", "alice"), Protection())
    assert len(plan.targets) == 500 and plan.forced  # a huge plan indeed
    msg = rb.render_approval_request(1, plan, "U0A", "alice", 0.0)
    assert bk.limit_problems(msg) == []
    assert [b for b in msg["blocks"] if b["type"] == "actions"]  # the buttons always survive


def test_alert_and_audit() -> None:
    alert = ra.render_alert_group(orphaned_alert())
    assert bk.limit_problems(alert) == []
    button = next(b for b in alert["blocks"] if b["type"] == "actions")["elements"][0]
    assert button["action_id"] == rb.ACTION_RESET_GPU and button["value"] == "node3:2"
    assert button["text"]["text"] == "Reset GPU 2"

    class A:
        def __init__(self, i: int) -> None:
            self.id, self.kind, self.actor, self.source = i, "reset", "U0A", "slack"
            self.command, self.node, self.gpus, self.status = "/gpu reset n1", "n1", (1,), "freed"
            from datetime import UTC, datetime

            self.started_at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)

    msg = rb.render_audit([A(i) for i in range(150)])
    assert bk.limit_problems(msg) == []
    assert "01-02 03:04:05" in bk.message_text(msg)
    assert "no actions" in bk.message_text(rb.render_audit([]))


def test_home_tab_within_view_limits() -> None:
    view = render_home("U0ALICE", "user1", big_fleet(), {"x": "down"}, seconds=1.0, now=0.0)
    assert view["type"] == "home"
    assert bk.limit_problems(view, view=True) == []
    text = bk.message_text(view)
    assert "Your processes" in text and "user1" in text
    unknown = render_home("U0X", None, [snap()], {}, seconds=0.1, now=0.0)
    assert "not mapped to a Linux user" in bk.message_text(unknown)


def test_text_form_keeps_content_and_escapes() -> None:
    msg = bk.text_form(fv.render_node(snap()))
    assert set(msg) == {"text"}
    assert "alice 4242" in msg["text"] and "&lt;!channel&gt;" in msg["text"]
    assert len(msg["text"]) <= bk.MAX_FALLBACK


def test_without_tables_keeps_the_rows_as_preformatted_text() -> None:
    msg = fv.render_fleet(big_fleet(), {}, seconds=1.0)
    plain = bk.without_tables(msg)
    assert plain is not None and bk.limit_problems(plain) == []
    assert not any(b["type"] == "table" for b in plain["blocks"])
    assert "node026" in bk.message_text(plain) and plain["text"] == msg["text"]
    assert bk.without_tables(bk.render_text("x")) is None
