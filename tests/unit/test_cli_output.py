"""``cli.output.Dropping``: a reset's output stream swallows its first failure and drops the
rest, so that nothing printed can stop the reset (the real pipes: ``test_reset_output.py``)."""

from __future__ import annotations

import errno
import io
from typing import TextIO, cast

import pytest

from gpubot.cli.output import Dropping


class Failing(io.StringIO):
    """A stream whose writes fail with ``error`` from the ``after``-th on; counts the tries."""

    def __init__(self, error: Exception, after: int = 0) -> None:
        super().__init__()
        self.error, self.after, self.tries = error, after, 0

    def write(self, s: str) -> int:
        self.tries += 1
        if self.tries > self.after:
            raise self.error
        return super().write(s)


@pytest.mark.parametrize(
    "error",
    [
        BrokenPipeError(errno.EPIPE, "Broken pipe"),  # `| head` is done
        OSError(errno.EIO, "Input/output error"),  # the terminal hung up
        OSError(errno.ENOSPC, "No space left on device"),
        ValueError("I/O operation on closed file."),
    ],
    ids=["EPIPE", "EIO", "ENOSPC", "closed"],
)
def test_the_first_failure_is_swallowed_and_the_rest_dropped(error: Exception) -> None:
    stream = Failing(error, after=1)
    out = Dropping(cast(TextIO, stream))
    dropped = []
    for line in ("plan\n", "signal=SIGTERM\n", "signal=SIGKILL\n"):  # the second one raises
        assert out.write(line) == len(line)  # taken, as far as the reset can tell
        dropped.append(out.dropped)
    assert dropped == [False, True, True]
    out.flush()
    assert (stream.tries, stream.getvalue()) == (2, "plan\n")  # never tried again


def test_control_the_stream_itself_raises() -> None:
    stream = Failing(BrokenPipeError(errno.EPIPE, "Broken pipe"))
    with pytest.raises(BrokenPipeError):
        print("signal=SIGKILL", file=stream)


def test_no_stream_at_all_drops_everything() -> None:
    """stdout closed before Python started (``>&-``): ``sys.stdout`` is None."""
    out = Dropping(None)
    assert out.dropped and out.write("x") == 1
    out.flush()


def test_other_attributes_are_the_streams() -> None:
    stream = io.StringIO()
    assert Dropping(cast(TextIO, stream)).isatty() is False
