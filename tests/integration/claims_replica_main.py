"""A gpubot replica for ``test_claims_replicas.py``: claims and the queue on one database.

    python -m tests.integration.claims_replica_main CONFIG DB_URL NAME

It runs the real claim flows (``chat.claims.ClaimDesk``) over the real app on the shared
database, built with a front end of its own whose direct messages go through the root's one
outbox as Slack's and Matrix's do, and prints one JSON line per event: ``ready``; for each
``claim USER NODE GPU`` line read on stdin, ``claimed`` or ``refused``; for ``wait USER NODE
GPU``, ``queued``; for ``tick``, one ``dm`` per direct message posted, then ``ticked``.
SIGTERM stops it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpubot.app import build
from gpubot.chat.claims import Dm
from gpubot.chat.flows import Flows
from gpubot.chat.message import Message
from gpubot.config import load
from gpubot.console.front import TextReporter
from gpubot.console.repl import TextSurface
from gpubot.core.alerting import Delivery, Lookup, MessageRef, Posted
from gpubot.core.claims import commands as cc
from gpubot.core.claims.rules import ClaimSettings
from gpubot.core.policy import Person
from gpubot.errors import GpubotError
from gpubot.services.outbox import Outbox


def emit(event: str, **data: Any) -> None:
    """Print one event line."""
    print(json.dumps({"event": event, "t": time.time(), "pid": os.getpid(), **data}), flush=True)


class Front:
    """This replica's front end: a direct message to ``U`` is posted to ``D-U`` through the
    outbox it is handed, and printed; the rest is the console's, or nothing."""

    min_update_s = 0.0

    def __init__(self, name: str) -> None:
        self.name = f"replica:{name}"
        self.replica = name

    def surface(self) -> TextSurface:
        return TextSurface(print)

    def reporter(self, settings: object) -> TextReporter:
        return TextReporter(lambda _: None)

    def directory(self) -> None:
        return None

    def dm(self, outbox: Outbox[Message]) -> Dm:
        async def dm(user: str, msg: Message, subject: str) -> bool:
            return await outbox.send_once(subject, f"D-{user}", msg)

        return dm

    def poster(self) -> Front:
        return self

    def alerts(self, settings: object, outbox: object, route: object) -> None:
        return None

    async def close(self) -> None:
        return None

    async def post(self, to: str, msg: Message, *, token: str, repeat_of: object = None) -> Posted:
        emit("dm", to=to.removeprefix("D-"), title=msg.title, name=self.replica)
        return Posted(Delivery.POSTED, MessageRef(f"{to}/{token}"))

    async def find(self, to: str, token: str, since: object) -> Lookup:
        return Lookup(True)

    async def direct(self, user: str) -> str | None:
        return f"D-{user}"


async def main(config: str, db_url: str, name: str) -> None:
    """Run until SIGTERM."""
    s = load(Path(config))
    s = dataclasses.replace(s, database_url=db_url, claims=ClaimSettings(enabled=True))
    app = build(s, {}, need_store=True, front=Front(name))
    flows = app.flows
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    commands = asyncio.create_task(read_commands(flows, name))
    emit("ready", name=name)
    await stop.wait()
    commands.cancel()
    await app.close()


async def run_line(flows: Flows, words: list[str]) -> None:
    """Run one line of the test's."""
    if words == ["tick"]:
        emit("ticked", sent=await flows.claims.tick())
        return
    verb, user, node, gpu = words
    who = Person(user, user, user.lower())
    try:
        if verb == "claim":
            msg = await flows.claims.answer(cc.ClaimGpus(node, (int(gpu),), 1, 3600.0), who)
            emit("claimed" if (msg.title or "").startswith("Claimed") else "refused", user=user)
        elif verb == "wait":
            await flows.claims.answer(cc.WaitFor(node, (int(gpu),)), who)
            emit("queued", user=user)
    except GpubotError as exc:
        emit("error", why=str(exc))


async def read_commands(flows: Flows, name: str) -> None:
    """Run the lines read from stdin, one at a time."""
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str] = asyncio.Queue()

    def reader() -> None:  # a daemon thread: a blocked read never holds up the exit
        for line in sys.stdin:
            loop.call_soon_threadsafe(lines.put_nowait, line)

    threading.Thread(target=reader, daemon=True).start()
    while True:
        await run_line(flows, (await lines.get()).split())


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3]))
