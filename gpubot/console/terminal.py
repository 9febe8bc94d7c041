"""The console read from stdin: the prompt in the main thread, the app on a thread of its own.

Why the split: only the main thread sees Ctrl-C (SIGINT); a prompt read on a worker thread can
not be interrupted, so Ctrl-C waited for Enter. Here the prompt also gets ``readline``'s editing
and a history kept in memory (no setting names a file for it). The app (``repl``) runs on an
event loop on its own thread and asks the main thread for each line.

At the prompt, Ctrl-C drops what was typed; on an empty line it says how to leave, and a second
Ctrl-C leaves, as Ctrl-D, ``quit`` and ``exit`` do (status 0). While a command runs, or lines
come from a pipe, Ctrl-C keeps every gpubot command's meaning: it stops, status 130.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import signal
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpubot.console.repl import PROMPT, ConsoleParts, repl

if TYPE_CHECKING:
    from gpubot.core.policy import Person

LEAVE_HINT = "(to leave: Ctrl-C again, Ctrl-D or quit)"
GOODBYE = "bye"


def banner(who: Person) -> str:
    """Return the console's first line on a terminal: who types, and how to get help or leave."""
    user = who.linux_user or "unknown"
    return f"gpubot console as {who.name} (Linux user {user}); type help, or quit"


class Prompt:
    """Reads the typed lines, in the main thread: on a terminal with ``readline`` (line editing,
    history), the banner first and the Ctrl-C and Ctrl-D rules above; from a pipe line by line."""

    def __init__(self, first: str, *, tty: bool | None = None) -> None:
        self.tty = sys.stdin.isatty() if tty is None else tty
        self._first = first
        self._armed = False  # the last key was Ctrl-C on an empty line: a second one leaves
        self._buffer: Callable[[], str] = lambda: ""
        if self.tty:
            import readline  # once loaded, input() edits the line and keeps the history

            self._buffer = readline.get_line_buffer

    def read(self) -> str | None:
        """Return the next line (None: the end). Off a terminal, Ctrl-C is the caller's."""
        if not self.tty:
            return sys.stdin.readline() or None
        if self._first:
            print(self._first, flush=True)
            self._first = ""
        while True:
            try:
                line = input(PROMPT)
            except EOFError:  # Ctrl-D on an empty line
                self._leave()
                return None
            except KeyboardInterrupt:  # the line typed so far is dropped
                if self._ctrl_c(self._buffer()):
                    return None
                continue
            self._armed = False
            return line

    def _ctrl_c(self, typed: str) -> bool:
        """Take a Ctrl-C at the prompt; return whether it leaves. A second Ctrl-C that comes
        while the hint is written (before the next prompt reads) leaves as well: it is the
        second press, not the console's to lose, nor a command's interruption."""
        if self._armed and not typed:
            self._leave()
            return True
        self._armed = not typed
        try:
            print("\n" + LEAVE_HINT if self._armed else "", flush=True)
        except KeyboardInterrupt:
            return self._ctrl_c("")
        return False

    def _leave(self) -> None:
        print("\n" + GOODBYE, flush=True)


class _Loop:
    """The console's event loop on a thread of its own, running ``repl`` (the app's lifecycle
    and every command); it asks the main thread for each line through ``asks``."""

    def __init__(self, parts: ConsoleParts, who: Person) -> None:
        self.parts, self.who = parts, who
        self.asks: queue.Queue[asyncio.Future[str | None] | None] = queue.Queue()
        self.loop = asyncio.new_event_loop()
        self._task: asyncio.Task[int] | None = None
        self._stopped = False
        self._code = 0
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="gpubot-console", daemon=True)

    def _run(self) -> None:
        # Ctrl-C is the main thread's. The kernel hands a process's SIGINT to any thread that
        # does not block it; taken by this one (or a thread it starts), it would leave the main
        # thread in readline's select() and the keypress would do nothing until the next key.
        # Blocked here, and so in every thread this one starts, it reaches the prompt. (The
        # processes it starts inherit the block; the local transport's run in sessions of their
        # own, which a terminal's Ctrl-C never reaches, and gpubot ends them with TERM or KILL.)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            with asyncio.Runner(loop_factory=lambda: self.loop) as runner:
                self._code = runner.run(self._main())
        except BaseException as exc:  # the main thread raises it (``result``)
            self._error = exc
        finally:
            self.asks.put(None)  # wakes the main thread: the console has ended

    async def _main(self) -> int:
        if self._stopped:  # interrupted before it started
            raise asyncio.CancelledError
        self._task = asyncio.current_task()
        return await repl(self.parts, self.who, self._next_line)

    async def _next_line(self) -> str | None:
        asked: asyncio.Future[str | None] = self.loop.create_future()
        self.asks.put(asked)
        return await asked

    def give(self, asked: asyncio.Future[str | None], line: str | None) -> None:
        def settle() -> None:
            if not asked.done():
                asked.set_result(line)

        self._soon(settle)

    def stop(self) -> None:
        """Cancel ``repl`` (Ctrl-C): the command under way stops, then the app closes."""

        def cancel() -> None:
            self._stopped = True
            if self._task is not None:
                self._task.cancel()

        self._soon(cancel)

    def _soon(self, call: Callable[[], None]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: nothing is left to tell
            self.loop.call_soon_threadsafe(call)

    def result(self) -> int:
        """Return ``repl``'s status, or raise what ended it (in the main thread)."""
        if self._error is not None:
            raise self._error
        return self._code


def session(parts: ConsoleParts, who: Person, prompt: Prompt) -> int:
    """Run the console, reading ``prompt`` in this (the main) thread; return its exit status.
    Ctrl-C outside the prompt stops ``repl``, waits for the app to close and raises again; a
    second Ctrl-C while it closes leaves at once."""
    console = _Loop(parts, who)
    console.thread.start()
    try:
        while (asked := console.asks.get()) is not None:
            console.give(asked, prompt.read())
    except KeyboardInterrupt:
        console.stop()
        console.thread.join()
        raise
    console.thread.join()
    return console.result()
