"""A hold's DM that fails is tried again while the hold lasts (the review of issue 34).

The claims' duty returned each live hold once per process, and marked it told before the front
end had tried the DM; the outbox took a refused (or given up) row for done. A DM that failed
(``conversations.open`` failing, Slack refusing the post, the outbox unwritable in a database
outage) was never tried again, and the hold ran out with its waiter untold: issue 34's symptom.
Now the duty returns a live hold on every turn until the front end says its DM was delivered,
and the outbox takes a refused row again; the DM is posted exactly once.

Over the memory store, the scripted transport (the recorded idle node) and a fake front end
that posts through the real outbox (``Outbox.publish_once``, as ``Outbox.send_once`` does).
The control, each case: the old code (``_announced`` set before delivery, the outbox taking
a refused row for done) leaves the DM unsent forever.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gpubot.chat.claims import ClaimDesk
from gpubot.chat.message import Message
from gpubot.config import Settings, parse
from gpubot.core.alerting import Delivery, Lookup, MessageRef, Posted
from gpubot.core.claims import commands as cc
from gpubot.core.claims.rules import ClaimSettings, WaitState
from gpubot.core.models import CommandResult
from gpubot.core.policy import Person
from gpubot.errors import GpubotError, StoreError
from gpubot.services.claims import ClaimService
from gpubot.services.outbox import Outbox
from gpubot.services.status import StatusService
from gpubot.store import Store, open_store
from gpubot.transport import ScriptedTransport
from gpubot.transport.scripted import answer, completed
from tests.fixtures.clock import VirtualClock

OUTPUTS = Path(__file__).parents[1] / "fixtures" / "probe_outputs"
DAVE = Person("U0DAVE", "dave", linux_user="dave")
FAULTS = ("open", "refused", "outage")  # conversations.open, the post, the outbox's write


def idle_node() -> tuple[str, CommandResult]:
    """The recorded idle node (2 GPUs, nothing on them): its device prefix and probe answer."""
    doc: dict[str, Any] = json.loads((OUTPUTS / "sim-idle.json").read_text(encoding="utf-8"))
    (probe,) = [c for c in doc["calls"] if c["program"] == "gpubot-probe"]
    return doc["dev_prefix"], completed((), probe["stdout"], probe["stderr"], probe["exit_status"])


@pytest.fixture
def store() -> Iterator[Store]:
    s = open_store("memory://")
    try:
        yield s
    finally:
        s.close()


class FrontEnd:
    """Slack's DMs in small: open the DM, then post once through the outbox; the first DM
    fails as ``fault`` says."""

    def __init__(self, store: Store, clock: VirtualClock, fault: str) -> None:
        self.store, self.clock, self.fault = store, clock, fault
        self.outbox: Outbox[Message] = Outbox(store.outbox)
        self.tries = 0
        self.posted: list[str] = []  # the subjects of the DMs in Slack

    async def dm(self, user: str, msg: Message, subject: str) -> bool:
        self.tries += 1
        first = self.tries == 1
        if first and self.fault == "open":
            return False  # conversations.open failed: logged, nothing sent

        async def send(token: str, repeat_of: datetime | None) -> Posted:
            if first and self.fault == "refused":
                return Posted(Delivery.REFUSED, why="fatal_error")
            self.posted.append(subject)
            return Posted(Delivery.POSTED, MessageRef(f"D{user[1:]}/{len(self.posted)}"))

        async def find(token: str, since: datetime) -> Lookup:
            return Lookup(True)  # the history was read: the post is not there

        now = datetime.fromtimestamp(self.clock.now(), UTC)
        try:
            if first and self.fault == "outage":
                raise StoreError("cannot record the post, so it was not posted: database down")
            return await self.outbox.publish_once(subject, send, find, now) is not False
        except GpubotError:  # as ``Outbox.send_once``: logged, nothing posted
            return False


async def duty(store: Store, clock: VirtualClock, *, queue: bool = True) -> ClaimDesk:
    """The claims' duty of one process (``queue``: with dave waiting for node1 GPU 0)."""
    prefix, probe = idle_node()
    nodes = [{"name": "node1", "host": "node1.lab", "dev_prefix": prefix}]
    base: Settings = parse({"nodes": nodes}, "holds.toml")
    settings = dataclasses.replace(base, claims=ClaimSettings(enabled=True))
    status = StatusService(settings, ScriptedTransport(answer({"gpubot-probe": probe})), store)
    svc = ClaimService(settings, store.claims, status, clock=clock)
    if queue:
        await svc.wait(DAVE, cc.WaitFor("node1", (0,)), "slack")
    return ClaimDesk(svc, source="slack")


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_hold_dm_that_failed_is_delivered_on_the_next_turn_exactly_once(
    store: Store, fault: str
) -> None:
    clock = VirtualClock()
    front = FrontEnd(store, clock, fault)
    desk = await duty(store, clock)
    desk.dm = front.dm
    assert await desk.tick() == 0  # the first look: GPU 0 free once
    await clock.advance(60)
    assert await desk.tick() == 0  # free twice: held for dave, and his DM fails
    (w,) = await store.claims.waits("node1")
    assert w.state is WaitState.OFFERED and front.tries == 1 and front.posted == []
    await clock.advance(60)
    # The control: before, the hold was marked told when first returned, and never again.
    assert await desk.tick() == 1, "the hold's DM is not tried again"
    assert len(front.posted) == 1 and front.posted[0].startswith(f"dm:claims:offer:{w.id}:")
    for _ in range(3):  # later turns, the hold still live: nothing more
        await clock.advance(60)
        assert await desk.tick() == 0
    assert len(front.posted) == 1 and front.tries == 2


async def test_a_hold_told_by_another_process_is_not_posted_again(store: Store) -> None:
    clock = VirtualClock()
    first = FrontEnd(store, clock, "none")
    desk = await duty(store, clock)
    desk.dm = first.dm
    await desk.tick()
    await clock.advance(60)
    assert await desk.tick() == 1 and len(first.posted) == 1
    other = FrontEnd(store, clock, "none")  # a replica, or this bot after a restart
    again = await duty(store, clock, queue=False)
    again.dm = other.dm
    await clock.advance(60)
    assert await again.tick() == 1  # known there (its outbox row is posted): told, not posted
    await clock.advance(60)
    assert await again.tick() == 0 and other.tries == 1  # and not asked again
    assert other.posted == [] and len(first.posted) == 1
