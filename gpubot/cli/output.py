"""A reset's output never stops the reset: what a closed pipe or a gone terminal cannot take is
dropped, and a hangup (SIGHUP) is held off until the reset has its outcome.

Once a reset's intent is in the audit log it must reach its outcome. If its output could raise,
``gpubot reset … | head -2`` would stop it between SIGTERM and SIGKILL: a stubborn process left
alive, a GPU never verified. So while ``kept_going()`` holds, stdout and stderr drop everything
after their first failed write, their descriptor pointed at ``/dev/null`` so that neither a later
write nor the flush at exit can fail. The outcome is in the audit log whatever was printed.

SIGHUP is held off by a handler that does nothing (one already ignored stays so). Ctrl-C still
stops the reset, recorded as interrupted with what was sent, and exits 130.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TextIO, cast

# Anything a write or flush of an output stream can raise once its reader or terminal is gone:
# OSError (EPIPE as BrokenPipeError, EIO, ENOSPC, …), ValueError (the file was closed).
OUTPUT_ERRORS = (OSError, ValueError)


def to_devnull(stream: TextIO | None) -> None:
    """Point ``stream``'s descriptor at ``/dev/null``, so whatever still writes to it succeeds."""
    try:
        fd = stream.fileno() if stream is not None else -1
    except (AttributeError, *OUTPUT_ERRORS):
        return
    if fd < 0:
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


class Dropping:
    """A text stream that never raises on output: after its first failure it drops everything."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream
        self.dropped = stream is None  # no stream at all (its fd closed at start): nothing goes

    def write(self, text: str) -> int:
        """Write ``text``, or drop it once the stream has failed; always say it was taken."""
        if not self.dropped and self.stream is not None:
            try:
                self.stream.write(text)
            except OUTPUT_ERRORS:
                self.drop()
        return len(text)

    def flush(self) -> None:
        """Flush the stream, or drop what it holds once it fails."""
        if not self.dropped and self.stream is not None:
            try:
                self.stream.flush()
            except OUTPUT_ERRORS:
                self.drop()

    def drop(self) -> None:
        """Drop this and every later write: the stream's descriptor now writes to /dev/null."""
        self.dropped = True
        to_devnull(self.stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _ignore_hangup(signum: int, frame: FrameType | None) -> None:
    """SIGHUP during a reset: go on. A handler, not SIG_IGN, so that a process the reset starts
    on this host gets SIGHUP's default back (SIG_IGN would be inherited across exec)."""


def _hold_hangup() -> Callable[[], None]:
    """Hold SIGHUP off; return what puts the handler before back."""
    try:
        before = signal.getsignal(signal.SIGHUP)
        if before is signal.SIG_IGN:  # nohup: already ignored
            return lambda: None
        signal.signal(signal.SIGHUP, _ignore_hangup)
    except ValueError:  # not the main thread (a test calling in): signals are not ours to set
        return lambda: None

    def restore() -> None:  # None: a handler not set from Python, i.e. SIGHUP's default
        signal.signal(signal.SIGHUP, signal.SIG_DFL if before is None else before)

    return restore


@contextmanager
def kept_going() -> Iterator[None]:
    """Run the block with output that cannot fail and SIGHUP held off; then put both back."""
    out, err = sys.stdout, sys.stderr
    writers = Dropping(out), Dropping(err)
    sys.stdout, sys.stderr = cast(TextIO, writers[0]), cast(TextIO, writers[1])
    restore = _hold_hangup()
    try:
        yield
    finally:
        for w in writers:  # a pipe closed unseen (stdout is block-buffered) is found here
            w.flush()
        sys.stdout, sys.stderr = out, err
        restore()
