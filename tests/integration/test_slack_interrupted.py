"""Interrupted actions on the Home tab and in ``/gpu sweep``'s report, until an approver marks
them reviewed with the Home tab's button (an audit record; then they are listed nowhere).

Signed HTTP requests into the real bolt app; the fake Web API records what was published.
"""

from __future__ import annotations

import json
import time
from typing import Any

from gpubot.chat.interrupted import ACTION_REVIEW
from gpubot.store import Store, open_store
from tests.fixtures.slack import Harness


async def _interrupted(harness: Harness) -> int:
    """Write what a reset that gpubot was killed in leaves: an intent, and no outcome (through
    a store of its own: the bot's store knows the actions it runs itself are not interrupted)."""
    store = open_store(harness.app.settings.database_url)
    try:
        return await _intents(store)
    finally:
        store.close()


async def _intents(store: Store) -> int:
    done = await store.begin_action(
        kind="reset",
        actor="U0ALICE",
        source="slack",
        command="/gpu reset node2 gpu 1",
        node="node2",
        gpus=[1],
        plan={"targets": []},
    )
    await store.finish_action(done, status="freed", result={})
    return int(
        await store.begin_action(
            kind="reset",
            actor="U0ALICE",
            source="slack",
            command="/gpu reset node1 gpu 3",
            node="node1",
            gpus=[3],
            plan={"targets": []},
        )
    )


async def _home(harness: Harness, user: str) -> dict[str, Any]:
    event = {
        "type": "app_home_opened",
        "user": user,
        "channel": "D0HOME",
        "tab": "home",
        "event_ts": f"{time.time():.6f}",
    }
    assert (await harness.send.event(event)).status == 200
    await harness.settle()
    view: dict[str, Any] = harness.fake.of("views.publish")[-1].body["view"]
    return view


def _buttons(view: dict[str, Any]) -> list[str]:
    return [
        str(b["accessory"]["value"])
        for b in view["blocks"]
        if (b.get("accessory") or {}).get("action_id") == ACTION_REVIEW
    ]


async def test_home_tab_and_sweep_name_it_until_an_approver_reviews_it(harness: Harness) -> None:
    harness.fake.groups["S0ONCALL"] = ["U0DAVE"]  # the on-call group, readable
    cut = await _interrupted(harness)
    line = f"reset #{cut} on node1 by U0ALICE at "
    carol = await _home(harness, "U0CAROL")  # an approver
    assert line in json.dumps(carol) and "1 interrupted action(s)" in json.dumps(carol)
    assert _buttons(carol) == [str(cut)]
    owner = await _home(harness, "U0OWNER")  # sees it, but may not mark it reviewed
    assert line in json.dumps(owner) and _buttons(owner) == []

    assert (await harness.send.command("sweep", user="U0BOB")).status == 200
    await harness.settle()
    report = harness.fake.ok("chat.update")[-1].body
    assert "interrupted action(s)" in json.dumps(report["blocks"])
    assert line in json.dumps(report["blocks"])

    # someone who is not an approver clicks (a forged click): refused, nothing recorded
    await harness.send.click(ACTION_REVIEW, str(cut), user="U0OWNER")
    await harness.settle()
    refused = harness.fake.of("views.publish")[-1].body["view"]
    assert "only on-call approvers can mark interrupted actions reviewed" in json.dumps(refused)
    assert [a.id for a in await harness.store.interrupted()] == [cut]

    await harness.send.click(ACTION_REVIEW, str(cut), user="U0CAROL")
    await harness.settle()
    after = harness.fake.of("views.publish")[-1].body["view"]
    assert f"action {cut} marked reviewed by you" in json.dumps(after)
    assert line not in json.dumps(after) and _buttons(after) == []
    assert await harness.store.interrupted() == []
    (rec,) = [r for r in await harness.store.records() if r.kind == "review"]
    assert (rec.action_id, rec.actor, rec.source) == (cut, "U0CAROL", "slack")

    assert (await harness.send.command("sweep", user="U0BOB")).status == 200
    await harness.settle()
    again = harness.fake.ok("chat.update")[-1].body
    assert "interrupted action" not in json.dumps(again["blocks"])


async def test_nothing_interrupted_means_no_block(harness: Harness) -> None:
    view = await _home(harness, "U0CAROL")
    assert "interrupted" not in json.dumps(view) and _buttons(view) == []


async def test_a_reset_the_bot_is_running_is_not_offered_for_review(harness: Harness) -> None:
    harness.fake.groups["S0ONCALL"] = ["U0DAVE"]
    running = await harness.store.begin_action(
        kind="reset",
        actor="U0ALICE",
        source="slack",
        command="/gpu reset node1 gpu 3",
        node="node1",
        gpus=[3],
        plan={"targets": []},
    )  # the bot's own store: this bot runs it (say, in its grace wait)
    view = await _home(harness, "U0CAROL")
    assert f"#{running}" not in json.dumps(view) and _buttons(view) == []
    await harness.store.finish_action(running, status="freed", result={})
