"""``gpubot claim …``: the ``/gpu`` claim and queue commands from a terminal.

The claimant is the Linux user running it, or ``--as`` a Slack user id. Exit status: 0 done, 1
refused, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from gpubot.app import App
from gpubot.chat.claims import CLAIM_COMMANDS, ClaimDesk
from gpubot.cli.common import with_app
from gpubot.cli.console import identity
from gpubot.console.text_render import render_text
from gpubot.core import commands
from gpubot.core.claims import commands as cc
from gpubot.core.claims.rules import Conflict, Granted, OverLimit, cuda_visible
from gpubot.core.policy import Person
from gpubot.errors import StoreError, UsageError
from gpubot.services.claims import ClaimService


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("words", nargs="+", metavar="WORD", help="e.g. node3 gpu 2,3 for 4h train")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.add_argument("--as", dest="as_id", metavar="USER_ID", help="claim as this Slack user id")


def parse_words(words: list[str]) -> cc.ClaimCommand:
    """Parse ``gpubot claim`` words: a claim/queue verb first, else the words of a claim."""
    line = " ".join(words)
    if words[0].lower() not in cc.USAGE or words[0].lower() == "claim":
        line = "claim " + " ".join(words[1:] if words[0].lower() == "claim" else words)
    cmd = commands.parse(line)
    if not isinstance(cmd, CLAIM_COMMANDS):
        raise UsageError(f"not a claim command: {words[0]!r}")
    return cmd


def run(args: argparse.Namespace) -> int:
    cmd = parse_words(list(args.words))

    async def body(app: App) -> int:
        svc = app.chat.claims
        if svc is None:
            raise StoreError("claims need the audit database, which is unavailable")
        who = identity(app.settings.policy, args.as_id)
        if args.json:
            doc, ok = await as_json(svc, cmd, who)
            print(json.dumps(doc, indent=2))
            return 0 if ok else 1
        desk = ClaimDesk(svc, source="cli")
        msg = await desk.answer(cmd, who)
        print(render_text(msg))
        return 1 if (msg.title or "").startswith("Not claimed") else 0

    return with_app(args, True, body)


async def as_json(svc: ClaimService, cmd: cc.ClaimCommand, who: Person) -> tuple[Any, bool]:
    """Return the JSON answer of ``cmd`` and whether it was done."""
    if isinstance(cmd, cc.ClaimGpus | cc.Take):
        got = (
            await svc.take(who, cmd.wait_id, "cli")
            if isinstance(cmd, cc.Take)
            else await svc.claim(who, cmd, "cli")
        )
        if isinstance(got, Granted):
            env = cuda_visible([c.gpu_uuid for c in got.claims])
            return {"claimed": [c.to_dict() for c in got.claims], "env": env}, True
        if isinstance(got, OverLimit):
            return {"refused": got.text()}, False
        assert isinstance(got, Conflict)
        return {
            "refused": "taken",
            "held": [c.to_dict() for c in got.held],
            "holds": [w.to_dict() for w in got.holds],
        }, False
    if isinstance(cmd, cc.Extend):
        done = await svc.extend(who, cmd, "cli")
        return {"extended": [{**c.to_dict(), "cut": cut} for c, cut in done]}, True
    if isinstance(cmd, cc.Release):
        return {"released": [c.to_dict() for c in await svc.release(who, cmd, "cli")]}, True
    if isinstance(cmd, cc.ListClaims):
        return {"claims": [c.to_dict() for c in await svc.claims(who, cmd)]}, True
    if isinstance(cmd, cc.WaitFor):
        w, ahead = await svc.wait(who, cmd, "cli")
        return {"queued": w.to_dict(), "ahead": ahead}, True
    if isinstance(cmd, cc.Queue):
        return {"queue": [w.to_dict() for w in await svc.queue(cmd.node)]}, True
    assert isinstance(cmd, cc.Leave)
    return {"left": [w.to_dict() for w in await svc.leave(who, cmd.wait_id, "cli")]}, True
