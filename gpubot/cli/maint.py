"""``gpubot maint …``: the ``/gpu maint`` commands from a terminal.

``gpubot maint node3 from Sat 02:00 for 4h because kernel update`` plans a window, ``gpubot maint
end node3`` ends it, ``gpubot maint [NODE]`` lists those open or planned. Whoever runs the CLI on
gpubot's own host holds its settings and database, so acts as on-call (as ``gpubot reset`` does),
audited as ``cli:<os user>``. Exit status: 0 done, 2 bad input (one line).
"""

from __future__ import annotations

import argparse
import json
import shlex

from gpubot.app import App
from gpubot.chat.maint_view import maint_answer
from gpubot.cli.common import cli_actor, with_app
from gpubot.console.text_render import render_text
from gpubot.core import commands
from gpubot.core import maint as mc
from gpubot.core.policy import Person
from gpubot.errors import StoreError, UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("words", nargs="*", metavar="WORD", help="e.g. node3 from Sat 02:00 for 4h …")
    p.add_argument("--json", action="store_true", help="print the windows as one JSON document")


def parse_words(words: list[str]) -> mc.MaintCommand:
    cmd = commands.parse(" ".join(["maint", *words]))
    if not isinstance(cmd, mc.MaintOpen | mc.MaintEnd | mc.MaintList):
        raise UsageError(f"not a maint command: {' '.join(words)!r}")
    return cmd


def run(args: argparse.Namespace) -> int:
    cmd = parse_words(list(args.words))
    text = shlex.join(["gpubot", "maint", *args.words])

    async def body(app: App) -> int:
        svc = app.chat.maint
        if svc is None:
            raise StoreError("maintenance windows need the audit database, which is unavailable")
        actor = cli_actor()
        who = Person(actor, actor.removeprefix("cli:"), None)
        now = svc.clock.now()
        msg = await maint_answer(svc, cmd, who, "cli", now, text, on_call=True)
        if args.json:
            windows = await svc.list(cmd.node if isinstance(cmd, mc.MaintList) else None)
            print(
                json.dumps(
                    {"said": render_text(msg), "windows": [w.to_dict() for w in windows]}, indent=2
                )
            )
        else:
            print(render_text(msg))
        return 0

    return with_app(args, True, body)
