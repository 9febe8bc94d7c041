"""What a person sees when something breaks under a Slack command, and what the approvals leave.

Every failure here is real where something real can produce it: a table of the bot's own
SQLite database renamed away or refusing a write (a trigger), a node whose SSH server is
stopped, nvidia-smi failing on the node. Only the "internal error" needs a fake: nothing real
raises a non-gpubot exception inside a flow, so a bug is planted at the status service's seam.

Each answer must be one line a person can act on, with no traceback and no Python in it.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from gpubot.chat.reset_view import ACTION_APPROVE
from gpubot.core.models import ApprovalState
from tests.fixtures.slack import Call, FakeSlack, Harness
from tests.procs import alive, until


def _sql(db: Path, *statements: str) -> None:
    """Change the bot's SQLite database behind its back (what a broken disk or admin does)."""
    conn = sqlite3.connect(db)
    try:
        for s in statements:
            conn.execute(s)
        conn.commit()
    finally:
        conn.close()


def _texts(fake: FakeSlack) -> list[str]:
    """Every top-level text the bot showed: messages, edits and ephemeral answers."""
    return [
        str(c.body.get("text", ""))
        for c in fake.calls
        if c.method.startswith(("chat.", "response:"))
    ]


def _shown(fake: FakeSlack, start: str) -> str:
    """Return the one answer that starts with ``start``; check it is one clean line."""
    hits = [t for t in _texts(fake) if t.startswith(start)]
    assert hits, _texts(fake)
    text = hits[-1]
    assert "\n" not in text.strip(), text
    everything = json.dumps([c.body for c in fake.calls], ensure_ascii=False)
    for leak in ("Traceback", 'File "', "Error:", "sqlalchemy", "sqlite3."):
        assert leak not in everything, (leak, text)
    return text


def _request(fake: FakeSlack) -> tuple[int, str]:
    """Return the approval id and message ts of the request in the on-call channel."""
    (post,) = [c for c in fake.ok("chat.postMessage") if c.body["channel"] == "C0ONCALL"]
    blocks = post.body.get("blocks") or []
    blocks = json.loads(blocks) if isinstance(blocks, str) else blocks
    actions = next(b for b in blocks if b["type"] == "actions")["elements"]
    return int(actions[0]["value"]), str(post.answer["ts"])


def _updates(fake: FakeSlack, ts: str) -> list[Call]:
    return [c for c in fake.ok("chat.update") if c.body["ts"] == ts]


@pytest.fixture
def db(tmp_path: Path, harness: Harness) -> Path:
    """The harness bot's SQLite database file."""
    path = tmp_path / "audit.db"
    assert path.exists()
    return path


# --- the command flows ------------------------------------------------------------------------


async def test_a_store_error_is_one_line(harness: Harness, db: Path) -> None:
    _sql(db, "ALTER TABLE audit_log RENAME TO audit_log_gone")
    await harness.send.command("audit", user="U0BOB")
    await harness.settle()
    text = _shown(harness.fake, "🛑 The audit log is unavailable, so nothing was done:")
    assert text.endswith(": cannot read the audit log: no such table: audit_log")


async def test_a_transport_error_is_one_line(harness: Harness, node1: Any) -> None:
    w = node1.spawn(gpu=1, mib=1024)
    node1.stop_server()
    try:
        await harness.send.command("reset node1 gpu 1", user="U0OWNER")
        await harness.settle()
    finally:
        node1.start_server()
    text = _shown(harness.fake, "📡 ")
    assert re.fullmatch(r"📡 node1: cannot connect to 127\.0\.0\.1:\d+: Connection refused", text)
    assert alive(w.pid)
    assert await harness.store.actions() == []  # nothing was begun, so nothing is incomplete


class _BuggyStatus:
    """The real status service, except that a fleet query hits a bug (a fake at the seam:
    nothing real raises a non-gpubot error there)."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    async def fleet(self, *args: Any, **kwargs: Any) -> Any:
        raise IndexError("list index out of range")


async def test_an_internal_error_says_so_and_keeps_the_details_in_the_log(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    harness.app.chat.status = _BuggyStatus(harness.app.chat.status)
    with caplog.at_level(logging.ERROR):
        await harness.send.command("status node1", user="U0BOB")
        await harness.settle()
    text = _shown(harness.fake, "💥 Internal error")
    assert text == "💥 Internal error: the details are in gpubot's log"
    assert "list index out of range" not in json.dumps([c.body for c in harness.fake.calls])
    logged = [r for r in caplog.records if r.exc_info and "status node1" in r.getMessage()]
    assert logged and "list index out of range" in str(logged[0].exc_info[1])  # type: ignore[index]


@pytest.mark.parametrize(
    ("command", "fault", "said"),
    [
        ("reset node1 gpu 9", None, "⚠ node1 has no GPU 9 (GPUs: 0, 1, 2, 3)"),
        (
            "reset node1 gpu 1",
            "driver-error",
            "⚠ node1: nvidia-smi failed (exit 9): NVIDIA-SMI has failed because it couldn't "
            "communicate with the NVIDIA driver.",
        ),
    ],
    ids=["no-such-gpu", "nvidia-smi-fails"],
)
async def test_a_planning_failure_is_one_line(
    harness: Harness, node1: Any, command: str, fault: str | None, said: str
) -> None:
    w = node1.spawn(gpu=1, mib=1024)
    node1.set_fault(fault)
    try:
        await harness.send.command(command, user="U0OWNER")
        await harness.settle()
    finally:
        node1.set_fault(None)
    assert _shown(harness.fake, "⚠ ").startswith(said)
    (planning,) = harness.fake.ok("chat.postMessage")  # the "planning" message, edited in place
    assert _updates(harness.fake, str(planning.answer["ts"]))[-1].body["text"].startswith(said)
    assert alive(w.pid) and await harness.store.actions() == []


async def test_a_failure_opening_an_approval_is_one_line(
    harness: Harness, node1: Any, db: Path
) -> None:
    w = node1.spawn(gpu=2, mib=3000)  # U0OWNER's: Bob's reset of it needs an approval
    _sql(db, "ALTER TABLE approvals RENAME TO approvals_gone")
    await harness.send.command("reset node1 gpu 2", user="U0BOB")
    await harness.settle()
    text = _shown(harness.fake, "🛑 The audit log is unavailable, so nothing was done:")
    assert text.endswith(": cannot record the approval request: no such table: approvals")
    assert [c for c in harness.fake.calls if c.body.get("channel") == "C0ONCALL"] == []
    assert alive(w.pid)


# --- approvals: an approved plan that fails, an end that cannot be recorded ------------------


async def _approved_request(harness: Harness, node1: Any) -> tuple[Any, int, str]:
    """Bob asks to kill U0OWNER's job on GPU 2; return it, the approval id and the request's ts."""
    w = node1.spawn(gpu=2, mib=3000)
    await harness.send.command("reset node1 gpu 2", user="U0BOB")
    await harness.settle()
    approval_id, ts = _request(harness.fake)
    assert alive(w.pid)
    return w, approval_id, ts


async def test_an_approved_plan_that_fails_is_failed_and_audited(
    harness: Harness, node1: Any
) -> None:
    w, approval_id, ts = await _approved_request(harness, node1)
    node1.stop_server()
    try:
        await harness.send.click(ACTION_APPROVE, str(approval_id), user="U0CAROL", message_ts=ts)
        await harness.settle()
    finally:
        node1.start_server()
    assert alive(w.pid)
    approval = await harness.store.approvals.get(approval_id)
    assert approval.state is ApprovalState.FAILED and "node1" in approval.result["error"]
    (action,) = await harness.store.actions()  # the attempt is in the audit log, ended
    assert action.status == "error" and action.kind == "reset"
    assert (await harness.store.verify()).ok


async def test_the_failure_of_an_approved_plan_is_shown_to_on_call_and_the_requester(
    harness: Harness, node1: Any
) -> None:
    _, approval_id, ts = await _approved_request(harness, node1)
    (asked,) = [c for c in harness.fake.ok("chat.postMessage") if c.body["channel"] != "C0ONCALL"]
    node1.stop_server()
    try:
        await harness.send.click(ACTION_APPROVE, str(approval_id), user="U0CAROL", message_ts=ts)
        await harness.settle()
    finally:
        node1.start_server()
    oncall = json.dumps(_updates(harness.fake, ts)[-1].body, ensure_ascii=False)
    requester = json.dumps(
        _updates(harness.fake, str(asked.answer["ts"]))[-1].body, ensure_ascii=False
    )
    assert "📡" in oncall and "node1" in oncall
    assert "the reset failed" in requester


async def test_an_end_that_cannot_be_recorded_leaves_the_approval_visibly_unfinished(
    harness: Harness, node1: Any, db: Path, caplog: pytest.LogCaptureFixture
) -> None:
    w, approval_id, ts = await _approved_request(harness, node1)
    # The database refuses to record how the approved action ended (and only that).
    _sql(
        db,
        "CREATE TRIGGER no_end BEFORE UPDATE OF state ON approvals "
        "WHEN NEW.state IN ('executed', 'failed') "
        "BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END",
    )
    with caplog.at_level(logging.ERROR):
        await harness.send.click(ACTION_APPROVE, str(approval_id), user="U0CAROL", message_ts=ts)
        await harness.settle()
    await until(lambda: not alive(w.pid), 10, "the approved kill")
    assert any(
        f"approval {approval_id}: cannot record its end" in r.getMessage() for r in caplog.records
    )
    # The reset itself is audited in full ...
    (action,) = await harness.store.actions()
    assert action.kind == "reset" and action.status == "freed"
    # ... and the approval never claims an end it could not record: it stays "approved" ...
    assert (await harness.store.approvals.get(approval_id)).state is ApprovalState.APPROVED
    # ... until the next start marks it incomplete, for a person to look at.
    _sql(db, "DROP TRIGGER no_end")
    (marked,) = await harness.app.chat.approvals.abandon_approved()
    assert marked.id == approval_id and marked.state is ApprovalState.INCOMPLETE
    assert "check the node and the audit log" in marked.result["error"]
    assert (await harness.store.verify()).ok
