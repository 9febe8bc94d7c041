"""``gpubot status --watch``: one frame of the fleet every few seconds, until told to stop.

On a terminal each frame is drawn over the last, line by line, so no blank screen flickers; off
one, frames follow each other after an empty line. SIGTERM ends it with 0, as it ends ``gpubot
serve``; Ctrl-C with 130, without a traceback.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable
from typing import TextIO

HOME, CLEAR_LINE, CLEAR_BELOW, CLEAR_ALL = "\033[H", "\033[K", "\033[J", "\033[2J"
DEFAULT_EVERY_S = 5.0
EXIT_INTERRUPTED = 130  # 128 + SIGINT

Frame = Callable[[], Awaitable[str]]


def heading(command: str, every_s: float, now: float) -> str:
    """Return a frame's first line: what is watched, how often, and when it was drawn."""
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(now))
    return f"Every {every_s:g} s: {command} · {at} · Ctrl-C ends"


def draw(out: TextIO, text: str, *, tty: bool, first: bool, gap: str = "\n") -> None:
    """Write one frame: over the last on a terminal, else after ``gap`` (an empty line)."""
    if tty:
        body = "\n".join(line + CLEAR_LINE for line in text.split("\n"))
        out.write((CLEAR_ALL if first else "") + HOME + body + "\n" + CLEAR_BELOW)
    else:
        out.write(("" if first else gap) + text + "\n")
    out.flush()  # a closed pipe shows here, as BrokenPipeError: main ends with 141


async def watch(frame: Frame, every_s: float, out: TextIO, *, tty: bool, gap: str = "\n") -> int:
    """Draw ``frame()`` every ``every_s`` seconds until SIGTERM (0) or SIGINT (130)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    code = 0

    def on_signal(sig: signal.Signals) -> None:
        nonlocal code
        code = EXIT_INTERRUPTED if sig is signal.SIGINT else 0
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        first = True
        while not stop.is_set():
            started = loop.time()
            task = asyncio.ensure_future(frame())
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                break
            draw(out, task.result(), tty=tty, first=first, gap=gap)
            first = False
            left = every_s - (loop.time() - started)
            if left > 0:
                await asyncio.wait({stopping}, timeout=left)
    finally:
        stopping.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return code
