"""What the bot is waiting on, on demand: ``kill -USR1 <pid>`` logs every asyncio task with its
stack and every thread's stack.

Set up by ``gpubot.slack.serve.listen`` while it runs. The dump is one log record (WARNING,
logger ``gpubot.slack.dump``) so that it stays together.
"""

from __future__ import annotations

import asyncio
import io
import logging
import sys
import threading
import traceback

log = logging.getLogger(__name__)


def render(loop: asyncio.AbstractEventLoop) -> str:
    """Return the stacks of ``loop``'s tasks and of every thread, as text."""
    out = io.StringIO()
    tasks = sorted(asyncio.all_tasks(loop), key=lambda t: t.get_name())
    out.write(f"{len(tasks)} asyncio task(s):\n")
    for task in tasks:
        state = "done" if task.done() else "cancelling" if task.cancelling() else "pending"
        out.write(f"--- task {task.get_name()!r} ({state})\n")
        task.print_stack(limit=20, file=out)
    names = {t.ident: t.name for t in threading.enumerate()}
    frames = sys._current_frames()
    out.write(f"{len(frames)} thread(s):\n")
    for ident, frame in sorted(frames.items()):
        out.write(f"--- thread {names.get(ident, '?')!r} ({ident})\n")
        out.write("".join(traceback.format_stack(frame, limit=20)))
    return out.getvalue()


def dump(loop: asyncio.AbstractEventLoop) -> None:
    """Log what ``loop``'s tasks and every thread are waiting on (on SIGUSR1)."""
    try:
        # Lines of its own after the record's (``extra`` key ``block``: cli/logs.py): a text
        # log's message is one line, and this dump is many.
        log.warning("SIGUSR1: what gpubot is waiting on", extra={"block": render(loop)})
    except Exception:  # a dump must never take the bot down
        log.exception("SIGUSR1: the dump failed")
