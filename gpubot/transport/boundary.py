"""Where library errors become gpubot's: one context manager for every transport.

What a failure means differs by call (a timeout opening a session is a stalled connection, one
reading output a command out of time), so each call site gives its own table of library
exception types to gpubot's, with the line a person sees (httpx's ``map_httpcore_exceptions``).

The nearest class in the exception's MRO wins. gpubot's own errors pass untouched
(``CommandTimeout`` is also a ``TimeoutError``: never mapped twice), as does anything unnamed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from gpubot.errors import GpubotError, ProbeError, TransportError, nearest

NodeError = type[TransportError] | type[ProbeError]  # both take (node, reason)
Reason = str | Callable[[Any], str]  # the line a person sees, or made from the library's error
ErrorMap = Mapping[type[BaseException], tuple[NodeError, Reason]]


@contextmanager
def map_errors(node: str, errors: ErrorMap) -> Iterator[None]:
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
