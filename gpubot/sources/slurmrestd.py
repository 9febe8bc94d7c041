"""The cluster's slurmrestd over HTTP (aiohttp): the ``SlurmRest`` port.

Every request carries ``X-SLURM-USER-NAME`` and ``X-SLURM-USER-TOKEN`` (slurmrestd's
``rest_auth/jwt``; without both it answers 401 to every path). The token is read once, from the
environment variable the settings name, by the composition root: it is never in the settings
file, and it is never logged or put in an error. One session (one connection pool), made on
first use on the running loop. aiohttp's errors, a timeout and a body that is not JSON become
``SlurmRestFailed`` here, one line each (httpx's ``map_httpcore_exceptions`` is the model).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import aiohttp

from gpubot.core.text import cut, one_line
from gpubot.errors import GpubotError, SlurmRestFailed
from gpubot.sources.http import failure_words, parse_json, read_capped

MAX_BODY = 256 * 2**20  # a /jobs of a large cluster is tens of MiB; more is refused, not read


class RestdClient:
    """GETs of one slurmrestd as one user; ``token`` None: the variable was not set, and
    every call fails saying so (a doctor and a fallback say it; nothing is asked)."""

    def __init__(
        self, url: str, user: str, token: str | None, *, timeout_s: float, token_env: str
    ) -> None:
        self.url = url.rstrip("/")
        self.user = user
        self.timeout_s = timeout_s
        self.token_env = token_env
        self._token = token
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(total=self.timeout_s)
            self._session = aiohttp.ClientSession(timeout=timeout, raise_for_status=False)
        return self._session

    async def get(self, path: str) -> tuple[int, Any]:
        """GET ``path``; return the status and the JSON body (None for an error status whose
        body is not JSON: slurmrestd's 401 and 404 are plain text)."""
        if not self._token:
            raise SlurmRestFailed(f"slurmrestd not asked: ${self.token_env} is not set")
        headers = {"X-SLURM-USER-NAME": self.user, "X-SLURM-USER-TOKEN": self._token}
        with self._mapped(path):
            async with self._open().get(
                self.url + path, headers=headers, allow_redirects=False
            ) as resp:
                status = resp.status
                body = await self._body(resp, path)
        try:
            doc = await parse_json(body)
        except ValueError:
            if status != 200:
                return status, None
            shown = cut(one_line(body[:200].decode(errors="replace").strip()), 120)
            raise SlurmRestFailed(f"{self._where(path)}: HTTP 200 but not JSON ({shown})") from None
        return status, doc

    async def _body(self, resp: aiohttp.ClientResponse, path: str) -> bytes:
        """The whole body (``read(n)`` gives what has come so far); ``SlurmRestFailed`` past
        ``MAX_BODY``."""
        body = await read_capped(resp, MAX_BODY)
        if body is None:
            raise SlurmRestFailed(f"{self._where(path)}: an answer over {MAX_BODY} bytes")
        return body

    def _where(self, path: str) -> str:
        return f"slurmrestd {self.url}{path}"

    @contextmanager
    def _mapped(self, path: str) -> Iterator[None]:
        try:
            yield
        except GpubotError:
            raise
        except Exception as exc:
            why = failure_words(exc)
            if why is None:
                raise
            raise SlurmRestFailed(f"{self._where(path)}: {why}") from exc

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
