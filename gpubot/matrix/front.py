"""Matrix as the composition root builds on it (``app.front.FrontEnd``): every outlet over one
client-server API adapter, whose one HTTP session ``close`` ends. The entry that runs Matrix
(``gpubot serve --chat matrix``) passes it in; the root names no front end.

Approvals, sweep alerts with their idle-holder DMs, the reclaim ladder, the claims' DMs and the
start-up report are here; the weekly digest and the audit head are posted by the root through
this front end's poster, as on Slack.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gpubot.chat.dm_route import DmRoute
from gpubot.chat.message import Message, Section, paragraph
from gpubot.config import Settings
from gpubot.core.ports import Report
from gpubot.matrix.alerts import MatrixAlerts
from gpubot.matrix.api import MatrixAccess, MatrixApi
from gpubot.matrix.poster import MatrixPoster, RoomSurface

if TYPE_CHECKING:
    from gpubot.chat.claims import Dm
    from gpubot.services.outbox import Outbox

log = logging.getLogger(__name__)

MIN_UPDATE_S = 1.0  # between two edits of one answer (Synapse limits a sender's events)


class MatrixFront:
    """Matrix's outlets for the root: approval requests, DMs, the start-up report."""

    name = "matrix"

    def __init__(self, access: MatrixAccess, *, min_update_s: float = MIN_UPDATE_S) -> None:
        self.min_update_s = min_update_s
        self.api = MatrixApi(access)
        self._poster = MatrixPoster(self.api)

    def surface(self) -> RoomSurface:
        """Edits of requests (an expiry) by their reference; nothing is posted without one."""
        return RoomSurface(self.api, None)

    def reporter(self, settings: Settings) -> MatrixReporter:
        return MatrixReporter(self.api, settings.policy.channel)

    def directory(self) -> None:
        """None: approver groups are Slack user groups; on Matrix approvers are listed."""

    def dm(self, outbox: Outbox[Message]) -> Dm:
        """Direct messages, each once through ``outbox`` (without a database: at most once)."""

        async def dm(user: str, msg: Message, subject: str) -> bool:
            room = await self._poster.direct(user)
            if room is None:  # not sent: the duty asks again on its next turn
                return False
            return await outbox.send_once(subject, room, msg)

        return dm

    def poster(self) -> MatrixPoster:
        return self._poster

    def alerts(
        self, settings: Settings, outbox: Outbox[Message], route: DmRoute
    ) -> MatrixAlerts | None:
        """Sweep alerts in ``[matrix] alerts_room`` (else the first room), and the idle
        holders' DMs; none without a room."""
        room = settings.sweep.channel
        if room is None:
            log.warning("no [matrix] rooms: sweeps run, but nothing is posted")
            return None
        people = settings.policy.chat_ids()
        return MatrixAlerts(self._poster, room, people=people, outbox=outbox, route=route)

    async def close(self) -> None:
        await self.api.close()


class MatrixReporter:
    """The ``Reporter`` port: tells a report in the first ``[matrix] rooms`` room."""

    def __init__(self, api: MatrixApi, room: str | None) -> None:
        self.api = api
        self.room = room

    async def report(self, report: Report) -> None:
        msg = Message(report.title, (Section(paragraph(report.text())),))
        if self.room is None:
            log.warning("no [matrix] rooms: not posted: %s", report.title)
            return
        await RoomSurface(self.api, self.room).reply(msg)
