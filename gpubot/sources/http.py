"""What the sources' HTTP clients share: aiohttp's failures in words (the one error map of
that library), a body read up to a bound, and JSON parsed off the loop when it is large."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from gpubot.core.text import cut, one_line
from gpubot.errors import nearest

BIG_BODY = 2**20  # a body this large is parsed in a worker thread: the loop keeps turning

HTTP_ERRORS: dict[type[BaseException], str] = {
    aiohttp.ServerTimeoutError: "no answer in time",
    aiohttp.ClientConnectorError: "no connection",
    aiohttp.ServerDisconnectedError: "the connection closed before an answer",
    aiohttp.ClientPayloadError: "the answer was cut",
    aiohttp.ClientResponseError: "a malformed answer",
    aiohttp.ClientError: "no answer",
    TimeoutError: "no answer in time",
    OSError: "no connection",
}


def failure_words(exc: BaseException) -> str | None:
    """Return an HTTP failure in words, with its own cut short; None: no failure of HTTP."""
    said = nearest(type(exc), HTTP_ERRORS)
    if said is None:
        return None
    detail = cut(one_line(str(exc)), 120)
    return f"{said} ({detail})" if detail and "in time" not in said else said


async def read_capped(resp: aiohttp.ClientResponse, most: int) -> bytes | None:
    """Return the whole body (``read(n)`` gives only what has come so far); None past ``most``."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(2**16):
        size += len(chunk)
        if size > most:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def parse_json(body: bytes) -> Any:
    """Parse ``body`` (``ValueError`` if it is not JSON), in a worker thread when large."""
    return await asyncio.to_thread(json.loads, body) if len(body) > BIG_BODY else json.loads(body)
