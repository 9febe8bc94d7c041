"""Where library errors become gpubot's: one context manager for every transport.

httpx's ``map_httpcore_exceptions`` is the model: a table from the library's exception types to
gpubot's, and one ``with map_errors(node, table):`` around each call into the library. What
each call's failure means differs (a timeout opening a session is a stalled connection, one
reading its output a command out of time), so each call site gives its own table, with the one
line a person sees for each entry; the mechanism, and the rule for choosing an entry, is here.

The entry chosen is the one for the nearest class in the exception's MRO (``TimeoutError``
before ``OSError``, ``asyncssh.PermissionDenied`` before ``asyncssh.Error``), so the order of
a table never matters. gpubot's own errors pass through untouched: ``NodeUnreachable`` is also
a ``ConnectionError`` and ``CommandTimeout`` a ``TimeoutError``, and neither is mapped twice.
Anything the table does not name passes through too, and so does ``CancelledError`` (not an
``Exception``).
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
