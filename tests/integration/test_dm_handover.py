"""Two front ends' processes on one database and one settings file, bob known on both: a DM the
Slack process owes bob goes to his Slack id through Slack, and to his Matrix id through the
Matrix process, which finds it handed over in the database (``chat.dm_route``) and posts it on
a real Synapse. The Slack process never tries Slack with a Matrix id."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpubot.core.alerting import MessageRef
from gpubot.core.usage.ladder import Step
from gpubot.matrix.settings import MatrixSettings, on_matrix
from tests.fixtures.ladder import notice
from tests.fixtures.matrix import MatrixHarness, MatrixWorld, dm_invite, running_matrix_bot
from tests.fixtures.settings import with_tables
from tests.fixtures.slack import (
    SLACK_EXTRA,
    FakeSlack,
    Harness,
    running_bot,
    users_table,
    workload_owner,
)
from tests.fixtures.slack_flows import idle_group

ALERT = MessageRef("C0GENERAL/1700000000.000100")  # the Slack alert an idle DM rides on


@contextlib.asynccontextmanager
async def both_fronts(
    world: MatrixWorld, fleet: Any, slack_settings: Any, fake: FakeSlack, folder: Path
) -> AsyncIterator[tuple[Harness, MatrixHarness]]:
    """The Slack bot and the Matrix bot, each on its own composition, over one database and
    one ``[users]`` table that knows bob by his Slack id and his Matrix id."""
    u = {n: c.user_id for n, c in world.users.items()}
    owner = workload_owner(fleet)
    users = {**users_table(owner), u["alice"]: owner, u["bob"]: "bob", u["carol"]: "carol"}
    tables = {**SLACK_EXTRA, "users": users, "approvals": {"approvers": ["U0CAROL", u["carol"]]}}
    on_slack = with_tables(slack_settings, tables)
    mx_settings = MatrixSettings(world.synapse.url, world.bot_id, rooms=(world.room,))
    on_mx = on_matrix(on_slack, mx_settings)
    url = f"sqlite:///{folder}/audit.db"
    async with (
        running_bot(on_slack, fake, url) as slack,
        running_matrix_bot(world, on_mx, url) as mx,
    ):
        yield slack, mx


async def due_duty(app: Any) -> None:
    """Run ``app``'s duty that posts the DMs handed over to it (as ``App.running`` runs it)."""
    duty = app.scheduler("dm-due")
    assert duty is not None
    await duty.job()


def body(e: dict[str, Any]) -> str:
    return str(e["content"].get("body", ""))


async def invited(world: MatrixWorld, name: str) -> bool:
    """Whether ``name`` has an invitation now (no wait)."""
    who = world.users[name]
    return bool((await who.call("GET", "/sync?timeout=0")).get("rooms", {}).get("invite"))


def slack_never_saw(fake: FakeSlack, user_id: str) -> bool:
    return not [c for c in fake.calls if user_id in str(c.body)]


@pytest.mark.parametrize("handed_over", [True, False], ids=["handed-over", "control-not"])
async def test_a_ladder_dm_reaches_bob_on_both_front_ends(
    matrix_world: MatrixWorld,
    slack_fleet: Any,
    slack_settings: Any,
    fake_slack: FakeSlack,
    tmp_path: Path,
    handed_over: bool,
) -> None:
    world, bob = matrix_world, matrix_world.users["bob"]
    async with both_fronts(world, slack_fleet, slack_settings, fake_slack, tmp_path) as (
        slack,
        mx,
    ):
        assert slack.app.flows.claims.dm is slack.app.parts.dms  # the claims' DMs too
        if not handed_over:
            slack.app.parts.dms.due = None  # the control: nowhere to hand it over
        # (the fake Web API has no DMs: bob's Slack DM is tried, and refused)
        told = await slack.app.sweep.ladder.notifier.tell(notice(Step.DM, "bob"))
        assert told is handed_over  # handed over, it is as good as told
        # Slack: bob's Slack id, through Slack; his Matrix id never sent to Slack
        assert [c.body.get("users") for c in fake_slack.of("conversations.open")] == ["U0BOB"]
        assert slack_never_saw(fake_slack, bob.user_id)
        # Matrix: its process's duty posts what was handed over, once
        kept = await mx.store.dm_due.due()
        assert [d.to for d in kept] == ([bob.user_id] if handed_over else [])
        await due_duty(mx.app)
        assert await mx.store.dm_due.due() == []
        if not handed_over:
            assert not await invited(world, "bob")  # without the hand-over: never told
            return
        room = await dm_invite(mx, "bob")
        await bob.join(room)
        said = await bob.wait_for(room, world.bot_id, lambda e: "node7 GPU 3 idle" in body(e))
        assert "!gpu keep" in body(said)  # Matrix's own words for the Keep button
        await due_duty(mx.app)  # nothing left: no second DM
        assert await slack.app.sweep.ladder.notifier.tell(notice(Step.DM, "bob"))  # told again
        await due_duty(mx.app)
    assert len([e for e in await bob.events(room) if "node7 GPU 3 idle" in body(e)]) == 1


async def test_an_idle_dm_riding_on_a_slack_alert_reaches_bob_on_matrix_unlinked(
    matrix_world: MatrixWorld,
    slack_fleet: Any,
    slack_settings: Any,
    fake_slack: FakeSlack,
    tmp_path: Path,
) -> None:
    """Without ``[ladder]``, an idle holder's alert carries a DM to its owner: on Matrix it
    comes from the Matrix process, without the link to the Slack alert it cannot show."""
    world, bob = matrix_world, matrix_world.users["bob"]
    async with both_fronts(world, slack_fleet, slack_settings, fake_slack, tmp_path) as (
        slack,
        mx,
    ):
        alerts = slack.app.sweep.keeper.notifier
        assert await alerts.direct(idle_group("bob"), ALERT) == 1  # handed over (Slack: refused)
        assert slack_never_saw(fake_slack, bob.user_id)
        await due_duty(mx.app)
        room = await dm_invite(mx, "bob")
        await bob.join(room)
        said = await bob.wait_for(room, world.bot_id, lambda e: "node7 GPU 3 idle" in body(e))
        assert "!gpu free" in body(said) and "also in" not in body(said)
        assert "C0GENERAL" not in str(said["content"])
        assert await mx.store.dm_due.due() == []
