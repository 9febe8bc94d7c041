"""Reading what Slurm says of a node: through the cluster's slurmrestd where the settings name
one, over the node's SSH otherwise, and over SSH again when slurmrestd fails.

slurmrestd's versions are discovered once (``/openapi/v3``) and the highest this parser reads
is kept until a path of it answers 404 (slurmrestd restarted with other plugins): then they are
discovered again and the read tried once more. Nodes read at once share one ``/jobs`` request.
``gres.conf`` is not served by slurmrestd: it is read over the node's SSH beside, and the GRES
map is unproven when it cannot be. A slurmrestd that fails (refused, 401, 5xx, a timeout, not
JSON, no version gpubot reads) is one note line in the view, whose jobs then come from the SSH
read: never "no jobs".
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from gpubot.core.models import NodeConfig, NodeSnapshot
from gpubot.core.ports import SlurmRest, Transport
from gpubot.core.slurm import JobAlloc, NodeState, SlurmSettings, SlurmView, rest
from gpubot.core.slurm.gresconf import gres_map
from gpubot.core.slurm.parse import SlurmParseError, jobs_on, node_state, openapi_versions
from gpubot.core.slurm.parse import pick_version as pick
from gpubot.core.slurm.read import SSH_SOURCE, gres_argv, parse_read, read_argv
from gpubot.core.text import one_line
from gpubot.errors import GpubotError, SlurmRestFailed

MakeView = Callable[[NodeSnapshot], SlurmView]


@dataclass(frozen=True)
class RestRead:
    """One node's answers from slurmrestd, read."""

    version: str
    node: NodeState | None  # None: Slurm does not know the node
    jobs: tuple[JobAlloc, ...]


class RestdReader:
    """The cluster's slurmrestd, read: its version discovered once, ``/jobs`` shared."""

    def __init__(self, api: SlurmRest) -> None:
        self.api = api
        self.discoveries = 0  # how many times the versions were asked (tests, the doctor)
        self._version: asyncio.Future[str] | None = None
        self._inflight: dict[str, asyncio.Future[tuple[int, Any]]] = {}

    async def version(self) -> str:
        """Return the version to read (discovered on the first call, or after a 404)."""
        v = self._version
        if v is None or (v.done() and (v.cancelled() or v.exception() is not None)):
            v = self._version = asyncio.ensure_future(self._discover())
        return await asyncio.shield(v)

    async def _discover(self) -> str:
        self.discoveries += 1
        status: int = 0
        doc: Any = None
        for path in rest.DISCOVERY:
            status, doc = await self.api.get(path)
            if status != 404:
                break
        if status != 200:
            raise SlurmRestFailed(f"slurmrestd versions: {rest.http_failure(status, doc)}")
        try:
            served = openapi_versions(doc)
        except SlurmParseError as exc:
            raise SlurmRestFailed(f"slurmrestd versions: {exc}") from None
        picked = pick(served)
        if picked is None:
            raise SlurmRestFailed(f"slurmrestd: {rest.no_version(served)}")
        return picked

    def _forget(self, version: str) -> None:
        v = self._version
        known = v is not None and v.done() and not v.cancelled() and v.exception() is None
        if known and v is not None and v.result() == version:
            self._version = None

    def _get(self, path: str) -> Awaitable[tuple[int, Any]]:
        """GET ``path``, sharing a request in flight for it."""
        task = self._inflight.get(path)
        if task is None:
            task = asyncio.ensure_future(self.api.get(path))
            self._inflight[path] = task
            task.add_done_callback(lambda t: self._done(path, t))
        return asyncio.shield(task)

    def _done(self, path: str, task: asyncio.Future[tuple[int, Any]]) -> None:
        if self._inflight.get(path) is task:
            del self._inflight[path]
        if not task.cancelled():
            task.exception()  # retrieved: no "never retrieved" log if its readers gave up

    async def read(self, slurm_node: str) -> RestRead:
        """Read ``slurm_node`` and the jobs on it; ``SlurmRestFailed`` (one line) if not."""
        for attempt in (1, 2):
            version = await self.version()
            (ns, nd), (js, jd) = await asyncio.gather(
                self._get(rest.node_path(version, slurm_node)), self._get(rest.jobs_path(version))
            )
            if 404 not in (ns, js) or attempt == 2:
                break
            self._forget(version)  # slurmrestd changed under us: discover again, once
        where = f"slurmrestd {version}"
        if not rest.node_answer(ns, nd, slurm_node):
            raise SlurmRestFailed(f"{where} node {slurm_node}: {rest.http_failure(ns, nd)}")
        if js != 200:
            raise SlurmRestFailed(f"{where} jobs: {rest.http_failure(js, jd)}")
        try:
            return RestRead(version, node_state(nd, slurm_node), jobs_on(jd, slurm_node))
        except SlurmParseError as exc:
            raise SlurmRestFailed(f"{where}: {exc}") from None


class SlurmReader:
    """One read of what Slurm says of a node, beside its probe (``StatusService``)."""

    def __init__(
        self, transport: Transport, settings: SlurmSettings, restd: RestdReader | None = None
    ) -> None:
        self.transport = transport
        self.settings = settings
        self.restd = restd

    async def read(self, node: NodeConfig, taken_at: float) -> MakeView:
        """Read Slurm's view of ``node``; return how to make it once the probe has said the
        GPUs' minors (the GRES map's fallback). A failed read is the view's error."""
        name = node.slurm_name
        if self.restd is None:
            return await self._ssh(node, name, taken_at)
        gres = asyncio.ensure_future(self._gres(node))
        try:
            said = await self.restd.read(name)
        except SlurmRestFailed as exc:
            over_ssh = await self._ssh(node, name, taken_at)
            await gres  # never fails: it was asked beside, and is not needed now
            note = f"read over SSH: {one_line(str(exc))}"
            return lambda snap: replace(over_ssh(snap), note=note)
        text = await gres
        source = f"slurmrestd {said.version}"

        def view(snap: NodeSnapshot) -> SlurmView:
            gmap = gres_map(text or "", name, _minors(snap))
            return SlurmView(said.node, said.jobs, taken_at, source, gres=gmap)

        return view

    async def _ssh(self, node: NodeConfig, name: str, taken_at: float) -> MakeView:
        timeout = self.settings.timeout_s
        try:
            res = await self.transport.run(node, read_argv(timeout), timeout=timeout * 3 + 3)
        except GpubotError as exc:
            why = f"Slurm not read: {_reason(exc, node.name)}"
            return lambda _: SlurmView(None, (), taken_at, SSH_SOURCE, error=why)
        return lambda snap: parse_read(res.stdout, name, _minors(snap), taken_at)

    async def _gres(self, node: NodeConfig) -> str | None:
        """The node's gres.conf over its SSH; None when it cannot be read (an unproven map)."""
        timeout = self.settings.timeout_s
        try:
            res = await self.transport.run(node, gres_argv(timeout), timeout=timeout * 2 + 3)
        except GpubotError:
            return None
        return res.stdout if res.exit_status == 0 else None


def _minors(snap: NodeSnapshot) -> list[int]:
    return [g.minor for g in snap.gpus if g.minor is not None]


def _reason(exc: GpubotError, node: str) -> str:
    text = str(exc)
    return text[len(node) + 2 :] if text.startswith(f"{node}: ") else text
