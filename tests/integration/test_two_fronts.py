"""Two front ends on one database, as two ``gpubot serve`` (``--chat slack`` and ``--chat
matrix``) run them: a Slack bot (signed requests, the loopback fake Web API) and a Matrix bot
on a real Synapse, each on its own composition, one SQLite audit database. Each one's approval
duty re-pings, expires and tells only the requests made through it; the other's it leaves
untouched, to that one's duty."""

from __future__ import annotations

import asyncio
import contextlib
import pwd
import socket
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from gpubot.core.alerting import Intent
from gpubot.core.approval.posts import Purpose, subject
from gpubot.core.clock import SystemClock
from gpubot.core.models import ApprovalState
from gpubot.matrix.render import APPROVAL_KEY
from gpubot.store import open_store
from gpubot.store.tables import outbox
from tests.fixtures.db import closed_port
from tests.fixtures.matrix import MatrixHarness, MatrixWorld, config_for, fleet_config, serving
from tests.fixtures.serve import http_env, run_serve, spawn_serve, stop_serve
from tests.fixtures.slack import (
    SECRET,
    FakeSlack,
    Harness,
    SlackSender,
    workload_owner,
)
from tests.procs import alive

ONCALL = "C0ONCALL"  # the Slack settings' on-call channel
EXPIRY_S = 12  # the two processes' requests: re-pinged after 6 s, expired after 12 s


class Later(SystemClock):
    """The system clock with wall time ``seconds`` ahead (deadlines keep real time)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def now(self) -> float:
        return time.time() + self.seconds


def at(seconds: float, *apps: Any) -> None:
    """Move each app's approvals (and so its duty) ``seconds`` ahead."""
    for app in apps:
        app.approvals.clock = Later(seconds)


async def duty(app: Any) -> None:
    """Run ``app``'s approval duty once (its schedule's job, as ``App.running`` runs it)."""
    await app.scheduler("approval-expiry").job()


async def state(store: Any, approval_id: int) -> ApprovalState:
    a = await store.approvals.get(approval_id)
    assert a is not None
    return a.state  # type: ignore[no-any-return]


def posts_about(store: Any, approval_id: int) -> list[str]:
    """The purposes of the outbox's posts about one approval, in the order they were made."""
    prefix = f"approval:{approval_id}:"
    with store.engine.begin() as conn:
        rows = conn.execute(select(outbox.c.subject).order_by(outbox.c.token)).all()
    return sorted(r.subject[len(prefix) :] for r in rows if r.subject.startswith(prefix))


def slack_thread(h: Harness, ts: str) -> list[dict[str, Any]]:
    return [m for (c, _), m in h.fake.messages.items() if c == ONCALL and m.get("thread_ts") == ts]


async def slack_request(h: Harness, node1: Any) -> tuple[Any, int, str]:
    """Bob asks in Slack for a forced kill on GPU 2; return the workload, the id and the ts."""
    w = node1.spawn(gpu=2, mib=3000)
    await h.send.command("reset node1 gpu 2", user="U0BOB")
    await h.settle()
    (a,) = await h.store.approvals.pending()
    assert a.source == "slack" and a.ref is not None and a.ref.startswith(f"{ONCALL}/")
    return w, a.id, a.ref.split("/", 1)[1]


async def matrix_request(m: MatrixHarness, node1: Any) -> tuple[Any, int, str]:
    """Bob asks on Matrix for a forced kill on GPU 3; return the workload, the id and the
    request's event id."""
    w = node1.spawn(gpu=3, mib=3000)
    await m.world.users["bob"].say(m.world.room, "!gpu reset node1 gpu 3")
    request = await m.said(lambda e: APPROVAL_KEY in e["content"])
    approval = await m.store.approvals.get(request["content"][APPROVAL_KEY])
    assert approval is not None and approval.source == "matrix"
    return w, approval.id, request["event_id"]


def in_thread_of(event_id: str, words: str) -> Any:
    def test(e: dict[str, Any]) -> bool:
        relates = e["content"].get("m.relates_to", {})
        shown = e["content"].get("m.new_content", e["content"])
        in_thread = relates.get("rel_type") == "m.thread" and relates["event_id"] == event_id
        return in_thread and words in shown.get("body", "")

    return test


def edit_of(event_id: str, words: str) -> Any:
    def test(e: dict[str, Any]) -> bool:
        relates = e["content"].get("m.relates_to", {})
        edit = relates.get("rel_type") == "m.replace" and relates["event_id"] == event_id
        return edit and words in e["content"]["m.new_content"]["body"]

    return test


async def test_each_front_ends_duty_handles_only_its_own_requests(
    harness: Harness, matrix: MatrixHarness, node1: Any
) -> None:
    slack, mx = harness.app, matrix.app
    assert slack.store.url == matrix.store.url  # one database
    w2, sid, ts = await slack_request(harness, node1)
    w3, mid, event = await matrix_request(matrix, node1)
    slack_calls = len(harness.fake.calls)

    # Half-way to expiry: Matrix's duty re-pings its own request, in its thread, and nothing
    # of Slack's (its poster would post into Slack's channel id).
    at(451, slack, mx)
    await duty(mx)
    await matrix.said(in_thread_of(event, "is still undecided"))
    assert posts_about(matrix.store, mid) == ["reping", "request"]
    assert posts_about(matrix.store, sid) == ["request"]
    assert len(harness.fake.calls) == slack_calls and slack_thread(harness, ts) == []
    # The control: the request was due its re-ping, and Slack's duty makes it, in Slack.
    await duty(slack)
    (ping,) = slack_thread(harness, ts)
    assert "is still undecided" in str(ping)
    assert posts_about(matrix.store, sid) == ["reping", "request"]
    assert posts_about(matrix.store, mid) == ["reping", "request"]  # no second, from Slack
    slack_calls = len(harness.fake.calls)

    # Past expiry: Matrix's duty expires its own request and edits it; Slack's stays pending,
    # its message and requester left to Slack's duty.
    at(901, slack, mx)
    await duty(mx)
    await matrix.said(edit_of(event, "nobody decided"))
    assert await state(matrix.store, mid) is ApprovalState.EXPIRED
    assert await state(matrix.store, sid) is ApprovalState.PENDING
    assert len(harness.fake.calls) == slack_calls
    # The control: Slack's duty expires it and edits its request in Slack.
    await duty(slack)
    assert await state(harness.store, sid) is ApprovalState.EXPIRED
    edits = [c for c in harness.fake.ok("chat.update") if c.body.get("ts") == ts]
    assert edits and "nobody decided" in str(edits[-1].body)
    assert posts_about(harness.store, sid) == ["reping", "request"]  # this fake has no DMs
    assert posts_about(harness.store, mid) == ["expired", "reping", "request"]  # Matrix's DM
    assert alive(w2.pid) and alive(w3.pid)


async def test_a_lost_post_is_settled_by_its_own_front_ends_duty(
    harness: Harness, matrix: MatrixHarness, node1: Any
) -> None:
    """A Slack re-ping whose answer was lost (its outbox row pending): Matrix's duty leaves the
    row untaken; Slack's settles it, in Slack."""
    _, sid, ts = await slack_request(harness, node1)
    pinged = datetime.fromtimestamp(Later(451).now(), UTC)  # the re-ping's time
    lost = Intent(subject(sid, Purpose.REPING), pinged, to=f"{ONCALL}/{ts}", once=True)
    began = await harness.store.outbox.begin(lost)
    assert began is not None
    at(600, harness.app, matrix.app)  # past the outbox's settle time (60 s) after it
    await duty(matrix.app)
    (left,) = await harness.store.outbox.pending("approval:", under=True)
    assert left.take == began.take  # not taken: Matrix's poster never tried it
    assert slack_thread(harness, ts) == []
    # The control: the post was due its settling, and Slack's duty settles it.
    await duty(harness.app)
    assert await harness.store.outbox.pending("approval:", under=True) == []
    (ping,) = slack_thread(harness, ts)
    assert "is still undecided" in str(ping)


# -- two gpubot serve processes, one settings file, one database ------------------------------


def both_config(world: MatrixWorld, fleet: Any, folder: Path) -> Path:
    """One settings file for both front ends: ``[slack]`` and ``[matrix]``, and each person
    in ``[users]`` and ``[approvals]`` by the id of the platform they use (bob on both)."""
    u = {n: c.user_id for n, c in world.users.items()}
    owner = workload_owner(fleet)
    tables: dict[str, dict[str, Any]] = {
        "slack": {"channel": "C0GENERAL", "oncall_channel": ONCALL},
        "matrix": {"homeserver": world.synapse.url, "user_id": world.bot_id, "rooms": [world.room]},
        "users": {
            "U0OWNER": owner,
            "U0BOB": "bob",
            "U0CAROL": "carol",
            u["alice"]: owner,
            u["bob"]: "bob",
            u["carol"]: "carol",
            "min_uid": min(1000, pwd.getpwnam(owner).pw_uid),
        },
        "approvals": {
            "approvers": ["U0CAROL", u["carol"]],
            "usergroup": "S0ONCALL",
            "expiry_s": EXPIRY_S,
        },
    }
    return fleet_config(fleet, folder, tables)


@contextlib.asynccontextmanager
async def slack_serving(
    config: Path, fake: FakeSlack, matrix_token: str | None = None
) -> AsyncIterator[tuple[SlackSender, asyncio.subprocess.Process, list[bytes]]]:
    """``gpubot serve --http`` on ``config`` (no sweeps, the duty every second); with
    ``matrix_token``, ``--chat both``: the Matrix bot too, in the same process. Yields what it
    said on stderr until it served."""
    port = str(closed_port())
    env = http_env(fake)
    args: tuple[str, ...] = ("--http", "--port", port, "--no-sweeps", "--expire-every", "1")
    waits = [b"serving Slack"]
    if matrix_token is not None:
        env["MATRIX_ACCESS_TOKEN"] = matrix_token
        args, waits = ("--chat", "both", *args), [*waits, b"serving Matrix"]
    proc = await spawn_serve(config, env, args, asyncio.subprocess.DEVNULL)
    try:
        assert proc.stderr is not None
        said: list[bytes] = []
        while not all(any(w in line for line in said) for w in waits):
            said.append(line := await asyncio.wait_for(proc.stderr.readline(), 60))
            assert line, b"gpubot serve ended before serving: " + b"".join(said[-10:])
        yield SlackSender(f"http://127.0.0.1:{port}/slack/events", SECRET, fake), proc, said
    finally:
        await stop_serve(proc)
    assert proc.returncode == 0  # SIGTERM stops every front end it serves, cleanly


@contextlib.asynccontextmanager
async def both_serving(
    config: Path, fake: FakeSlack, world: MatrixWorld, processes: int
) -> AsyncIterator[tuple[SlackSender, asyncio.subprocess.Process]]:
    """Slack and Matrix served by two ``gpubot serve`` processes, or by one ``--chat both``;
    the process yielded is the one that serves Matrix."""
    if processes == 1:
        async with slack_serving(config, fake, world.bot_token) as (slack, proc, _):
            yield slack, proc
        return
    async with (
        slack_serving(config, fake) as (slack, _, _),
        serving(config, world.bot_token) as matrix_proc,
    ):
        yield slack, matrix_proc


@pytest.mark.parametrize("processes", [2, 1], ids=["two-processes", "chat-both"])
async def test_slack_and_matrix_served_on_one_database_each_keep_to_their_own(
    matrix_world: MatrixWorld,
    slack_fleet: Any,
    fake_slack: FakeSlack,
    node1: Any,
    tmp_path: Path,
    processes: int,
) -> None:
    """``gpubot serve --chat slack`` and ``--chat matrix`` on one settings file and database,
    or one ``gpubot serve --chat both``: bob asks on each; each request is re-pinged and
    expires in its own front end only."""
    world, fake = matrix_world, fake_slack
    config = both_config(world, slack_fleet, tmp_path)
    node1.spawn(gpu=2, mib=3000)
    node1.spawn(gpu=3, mib=3000)
    async with both_serving(config, fake, world, processes) as (slack, matrix_proc):
        assert (await slack.command("reset node1 gpu 2", user="U0BOB")).status == 200
        await world.users["bob"].say(world.room, "!gpu reset node1 gpu 3")
        alice = world.users["alice"]
        request = await alice.wait_for(
            world.room, world.bot_id, lambda e: APPROVAL_KEY in e["content"]
        )
        ping = await alice.wait_for(
            world.room, world.bot_id, in_thread_of(request["event_id"], "is still undecided")
        )
        await alice.wait_for(world.room, world.bot_id, edit_of(request["event_id"], "nobody"))

        def slack_expired() -> bool:
            return any("nobody decided" in str(c.body) for c in fake.ok("chat.update"))

        await fake.wait_for(slack_expired, 60)
        (slack_ping,) = [c for c in fake.ok("chat.postMessage") if "still undecided" in str(c.body)]
        # each re-ping names the approvers its own front end can mention, and only those
        assert world.users["carol"].user_id in ping["content"]["body"]
        assert "U0CAROL" not in str(ping["content"]) and "S0ONCALL" not in str(ping["content"])
        assert "U0CAROL" in str(slack_ping.body) and "S0ONCALL" in str(slack_ping.body)
        assert world.users["carol"].user_id not in str(slack_ping.body)
        assert matrix_proc.returncode is None
    store = open_store(f"sqlite:///{tmp_path}/audit.db")
    try:
        made = [await store.approvals.get(i) for i in (1, 2)]  # the only two, as made
        with store.engine.begin() as conn:
            rows = conn.execute(
                select(outbox.c.subject, outbox.c.destination, outbox.c.state)
            ).all()
    finally:
        store.close()
    by = {a.source: a for a in made if a is not None and a.state is ApprovalState.EXPIRED}
    slack_req, matrix_req = by["slack"], by["matrix"]
    assert slack_req.ref is not None and matrix_req.ref is not None
    pings = {r.subject: r.destination for r in rows if r.subject.endswith(":reping")}
    assert {r.state for r in rows if r.subject.endswith(":reping")} == {"posted"}
    assert pings == {  # each re-pinged once, in its own front end's thread
        f"approval:{slack_req.id}:reping": slack_req.ref,
        f"approval:{matrix_req.id}:reping": matrix_req.ref,
    }
    assert slack_req.ref.startswith(f"{ONCALL}/") and matrix_req.ref.startswith(world.room)
    assert not [c for c in fake.calls if str(c.body.get("channel", "")).startswith("!")]


async def test_chat_both_serves_the_settings_metrics_port_once(
    matrix_world: MatrixWorld, slack_fleet: Any, fake_slack: FakeSlack, tmp_path: Path
) -> None:
    """``[metrics] port`` is the process's: with ``--chat both`` the first composition serves it
    and the second does not bind it again (which failed the start)."""
    config = both_config(matrix_world, slack_fleet, tmp_path)
    port = closed_port()
    config.write_text(config.read_text() + f"\n[metrics]\nport = {port}\n")
    async with slack_serving(config, fake_slack, matrix_world.bot_token) as (_, proc, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert answer.startswith(b"HTTP/1.0 200") and b"gpubot_" in answer
        assert proc.returncode is None


async def test_chat_both_whose_slack_port_is_taken_ends_both_in_one_line(
    matrix_world: MatrixWorld, slack_fleet: Any, fake_slack: FakeSlack, tmp_path: Path
) -> None:
    """One listener failing (Slack's port is taken) stops the other, which ends (drained)
    before the apps close: the start fails in one line, never a traceback."""
    config = both_config(matrix_world, slack_fleet, tmp_path)
    env = http_env(fake_slack, MATRIX_ACCESS_TOKEN=matrix_world.bot_token)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        args = ("--chat", "both", "--http", "--port", port, "--no-sweeps")
        code, err = await run_serve(config, env, *args)
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert code == 2 and len(errors) == 1, err
    assert errors[0].startswith(f"gpubot: error: cannot serve Slack on 127.0.0.1:{port}")
    assert "Traceback" not in err and "Task was destroyed" not in err


@pytest.mark.parametrize("slack_channel", [False, True], ids=["matrix-only-room", "both"])
async def test_chat_both_sweeps_on_the_side_that_has_a_place_for_alerts(
    matrix_world: MatrixWorld,
    slack_fleet: Any,
    fake_slack: FakeSlack,
    tmp_path: Path,
    slack_channel: bool,
) -> None:
    """Slack sweeps (and serves the metrics) unless only Matrix has a room for the alerts: then
    Matrix does, said at start; the control: with a Slack channel, Slack does, unsaid."""
    w = matrix_world
    config = config_for(w, slack_fleet, tmp_path, w.synapse.url, slack=slack_channel)
    async with slack_serving(config, fake_slack, w.bot_token) as (_, _, said):
        pass
    matrix_sweeps = any(b"sweeps and metrics run on the Matrix side" in x for x in said)
    assert matrix_sweeps is not slack_channel, b"".join(said)
