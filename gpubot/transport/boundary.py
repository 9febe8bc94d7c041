"""Where library errors become gpubot's: one context manager for every transport.

What a failure means differs by call (a timeout opening a session is a stalled connection, one
reading output a command out of time), so each call site gives its own table of library
exception types to gpubot's, with the line a person sees (httpx's ``map_httpcore_exceptions``).

The entry for the nearest class in the exception's MRO wins, so a table's order never matters.
gpubot's own errors pass untouched (``CommandTimeout`` is also a ``TimeoutError``: never mapped
twice), and so does anything the table does not name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from gpubot.errors import GpubotError, ProbeError, TransportError

NodeError = type[TransportError] | type[ProbeError]  # both take (node, reason)
Reason = str | Callable[[Any], str]  # the line a person sees, or made from the library's error
ErrorMap = Mapping[type[BaseException], tuple[NodeError, Reason]]


def nearest(kind: type[BaseException], errors: ErrorMap) -> tuple[NodeError, Reason] | None:
    """Return the entry of ``errors`` for the nearest class in ``kind``'s MRO, if any."""
    return next((errors[k] for k in kind.__mro__ if k in errors), None)


@contextmanager
def map_errors(node: str, errors: ErrorMap) -> Iterator[None]:
    """Raise gpubot's error that ``errors`` names for a library error raised in the block."""
    try:
        yield
    except GpubotError:
        raise
    except Exception as exc:
        found = nearest(type(exc), errors)
        if found is None:
            raise
        kind, reason = found
        raise kind(node, reason if isinstance(reason, str) else reason(exc)) from exc
