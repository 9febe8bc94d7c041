"""The Matrix client-server API over aiohttp: the one place this front end meets HTTP.

Every failure leaves as ``ChatCallFailed`` (the homeserver's ``errcode``, or ``HTTP N``) or, when
no answer came (a timeout, a dropped connection: the call may have applied), ``ChatUnanswered``;
``matrix_errors`` maps them at this boundary. One session (connection pool) per adapter,
opened on first use and closed by ``close``.

A message is sent with ``PUT /rooms/{room}/send/{type}/{txnId}``: the homeserver makes one event
per transaction id for one access token and device, so a retry with the same id never makes a
second event (the outbox's token is that id). Synapse remembers a transaction for at least 30
minutes; the outbox settles a lost post well within that.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from gpubot.errors import ChatCallFailed, ChatUnanswered

TIMEOUT_S = 30.0  # one call (a long poll adds its own wait)
PREFIX = "/_matrix/client/v3"


@dataclass(frozen=True)
class MatrixAccess:
    """Where and as whom: read by the entry from the settings and the environment."""

    homeserver: str  # https://matrix.lab.example (no trailing slash)
    user_id: str
    token: str
    device_id: str
    timeout_s: float = TIMEOUT_S


@asynccontextmanager
async def matrix_errors(what: str) -> AsyncIterator[None]:
    """Map aiohttp's failures (no answer: the call may have applied) to ``ChatUnanswered``."""
    try:
        yield
    except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
        raise ChatUnanswered(what, type(exc).__name__) from None
    except aiohttp.ContentTypeError:
        raise ChatCallFailed(what, "not a Matrix homeserver (no JSON answer)") from None
    except aiohttp.ClientError as exc:
        raise ChatCallFailed(what, type(exc).__name__) from None


def new_txn() -> str:
    """A transaction id for a send that is not the outbox's (answers, edits, reactions)."""
    return "g" + secrets.token_hex(12)


class MatrixApi:
    """The calls the front end makes, as the bot's user on its device."""

    def __init__(self, access: MatrixAccess) -> None:
        self.access = access
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers={"Authorization": f"Bearer {self.access.token}"}
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        params: Mapping[str, str] | None = None,
        wait_s: float = 0.0,
    ) -> dict[str, Any]:
        """Call ``path`` of the client API; return its JSON. ``wait_s``: a long poll's wait."""
        what = f"{method} {path.split('?')[0]}"
        timeout = aiohttp.ClientTimeout(total=self.access.timeout_s + wait_s)
        url = f"{self.access.homeserver}{PREFIX}{path}"
        async with (
            matrix_errors(what),
            self._http().request(method, url, json=body, params=params, timeout=timeout) as r,
        ):
            answer = await r.json()
        if not isinstance(answer, dict):
            raise ChatCallFailed(what, "not a Matrix answer (no JSON object)")
        if r.status != 200:
            raise ChatCallFailed(what, str(answer.get("errcode") or f"HTTP {r.status}"))
        return answer

    async def whoami(self) -> dict[str, Any]:
        return await self.call("GET", "/account/whoami")

    async def send(
        self, room: str, content: Mapping[str, Any], *, txn: str, kind: str = "m.room.message"
    ) -> str:
        """Send one event; return its id (the same one for the same ``txn``)."""
        path = f"/rooms/{quote(room)}/send/{quote(kind)}/{quote(txn)}"
        return str((await self.call("PUT", path, content))["event_id"])

    async def event(self, room: str, event_id: str) -> dict[str, Any]:
        return await self.call("GET", f"/rooms/{quote(room)}/event/{quote(event_id)}")

    async def messages(self, room: str, start: str | None, limit: int) -> dict[str, Any]:
        """One page of ``room``'s timeline, newest first (``start``: the last page's end)."""
        params = {"dir": "b", "limit": str(limit)}
        if start is not None:
            params["from"] = start
        return await self.call("GET", f"/rooms/{quote(room)}/messages", params=params)

    async def state(self, room: str, kind: str) -> dict[str, Any] | None:
        """The room's state event of ``kind`` (its content), or None when it has none."""
        try:
            return await self.call("GET", f"/rooms/{quote(room)}/state/{quote(kind)}")
        except ChatCallFailed as exc:
            if exc.error == "M_NOT_FOUND":
                return None
            raise

    async def joined_members(self, room: str) -> set[str]:
        answer = await self.call("GET", f"/rooms/{quote(room)}/joined_members")
        joined = answer.get("joined")
        return set(joined) if isinstance(joined, dict) else set()

    async def joined_rooms(self) -> set[str]:
        rooms = (await self.call("GET", "/joined_rooms")).get("joined_rooms")
        return {str(r) for r in rooms} if isinstance(rooms, list) else set()

    async def join(self, room: str) -> None:
        await self.call("POST", f"/join/{quote(room)}", {})

    async def create_dm(self, user: str) -> str:
        body = {"is_direct": True, "invite": [user], "preset": "trusted_private_chat"}
        return str((await self.call("POST", "/createRoom", body))["room_id"])

    async def sync(self, since: str | None, wait_s: float) -> dict[str, Any]:
        """One ``/sync``: at once without ``since`` (the first), else a long poll."""
        params = {"timeout": str(int(wait_s * 1000)) if since else "0"}
        if since is not None:
            params["since"] = since
        else:  # the first sync: no backlog is run, so none is fetched
            params["filter"] = '{"room":{"timeline":{"limit":1}}}'
        return await self.call("GET", "/sync", params=params, wait_s=wait_s)


async def pause(seconds: float) -> None:
    """Wait before a retry of the sync loop (a homeserver down is retried, never a crash)."""
    await asyncio.sleep(seconds)
