"""The site's Prometheus over HTTP (aiohttp): instant queries for the fleet summary and for a
sweep's candidates.

``GET /api/v1/query?query=...``, the same API for Prometheus, Thanos and Mimir. A bearer token,
where the settings name a variable that is set, goes in ``Authorization``; it is read once by the
composition root and never logged or put in an error. One session (one connection pool), made on
first use on the running loop. A refused connection, a timeout, an HTTP error, a body that is not
JSON and PromQL's own ``"status": "error"`` become ``PrometheusFailed``, one line each.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import aiohttp

from gpubot.core.telemetry import CandidateRule, PromSettings, candidate_queries, queries
from gpubot.core.text import cut, one_line
from gpubot.errors import PrometheusFailed
from gpubot.sources.http import failure_words, parse_json, read_capped

MAX_BODY = 64 * 2**20  # 20,000 GPUs' series of one field are a few MiB


class PromClient:
    """Instant queries of one Prometheus."""

    def __init__(self, settings: PromSettings, token: str | None) -> None:
        if settings.url is None:
            raise ValueError("PromClient needs [prometheus] url")
        self.url = settings.url.rstrip("/")
        self.settings = settings
        self._token = token
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(total=self.settings.timeout_s)
            self._session = aiohttp.ClientSession(timeout=timeout, raise_for_status=False)
        return self._session

    async def query(self, promql: str) -> list[dict[str, Any]]:
        """Return an instant query's result vector; ``PrometheusFailed`` (one line) if none."""
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        try:
            async with self._open().get(
                self.url + "/api/v1/query",
                params={"query": promql},
                headers=headers,
                allow_redirects=False,
            ) as resp:
                status = resp.status
                body = await self._body(resp)
        except PrometheusFailed:
            raise
        except Exception as exc:
            why = failure_words(exc)
            if why is None:
                raise
            raise PrometheusFailed(f"prometheus {self.url}: {why}") from exc
        return await self._vector(status, body)

    async def _body(self, resp: aiohttp.ClientResponse) -> bytes:
        body = await read_capped(resp, MAX_BODY)
        if body is None:
            raise PrometheusFailed(f"prometheus {self.url}: an answer over {MAX_BODY} bytes")
        return body

    async def _vector(self, status: int, body: bytes) -> list[dict[str, Any]]:
        try:
            doc = await parse_json(body)
        except ValueError:
            shown = cut(one_line(body[:200].decode(errors="replace").strip()), 120)
            raise PrometheusFailed(
                f"prometheus {self.url}: HTTP {status}, not JSON ({shown})"
            ) from None
        if not isinstance(doc, dict) or doc.get("status") != "success":
            error = doc.get("error", "no status") if isinstance(doc, dict) else "not an object"
            said = cut(one_line(str(error)), 120)
            raise PrometheusFailed(f"prometheus {self.url}: HTTP {status}: {said}")
        data = doc.get("data")
        if not isinstance(data, dict) or data.get("resultType") != "vector":
            raise PrometheusFailed(f"prometheus {self.url}: the answer is not an instant vector")
        result = data.get("result")
        if not isinstance(result, list):
            raise PrometheusFailed(f"prometheus {self.url}: the answer has no result list")
        return [r for r in result if isinstance(r, dict)]

    async def summary_vectors(self) -> Mapping[str, list[dict[str, Any]]]:
        """Run the summary's queries at once; the first failure fails them all."""
        return await self._all(queries(self.settings.labels))

    async def candidate_vectors(self, rule: CandidateRule) -> Mapping[str, list[dict[str, Any]]]:
        """Run a sweep's candidate queries at once (by reason); the first failure fails them all."""
        return await self._all(candidate_queries(self.settings.labels, rule))

    async def _all(self, asked: Mapping[str, str]) -> Mapping[str, list[dict[str, Any]]]:
        answers = await asyncio.gather(*(self.query(q) for q in asked.values()))
        return dict(zip(asked, answers, strict=True))

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
