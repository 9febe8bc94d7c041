"""An action the bot died in the middle of is reported when the bot starts again."""

from __future__ import annotations

from tests.fixtures.slack import Harness


async def test_incomplete_actions_are_reported_at_start(harness: Harness) -> None:
    store = harness.store
    done = await store.begin_action(
        kind="reset",
        actor="U0BOB bob",
        source="slack",
        command="/gpu reset node1 gpu 1",
        node="node1",
        gpus=[1],
        plan={"targets": []},
    )
    await store.finish_action(done, status="freed", result={})
    died = await store.begin_action(
        kind="reset",
        actor="U0ALICE alice",
        source="slack",
        command="/gpu reset node2 gpu 3",
        node="node2",
        gpus=[3],
        plan={"targets": []},
    )
    await harness.start_up()
    (post,) = [c for c in harness.fake.ok("chat.postMessage")]
    text = post.body["text"]
    assert "1 action(s) never recorded an outcome" in text
    assert f"#{died} reset on node2 by U0ALICE alice" in text and "/gpu reset node2 gpu 3" in text
    assert f"#{done} " not in text


async def test_nothing_is_posted_when_every_action_finished(harness: Harness) -> None:
    await harness.start_up()
    assert harness.fake.ok("chat.postMessage") == []
