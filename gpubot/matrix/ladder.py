"""The reclaim ladder on Matrix: the owner's DMs (steps 1-2) and the alerts room's posts (3-4).

Each message goes once through the one outbox, its token the transaction id. Matrix has no
buttons or modals: the messages say what to type (``!gpu free KEY``, ``!gpu keep KEY because
REASON``, on-call's ``!gpu oncall-free KEY``), which ``matrix.typed`` runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpubot.chat.ladder import LadderTeller
from gpubot.chat.message import Message
from gpubot.matrix.poster import MatrixPoster
from gpubot.services.outbox import Outbox


class MatrixLadder(LadderTeller):
    """Tells the ladder's steps on Matrix: DMs, and posts in the alerts room."""

    def __init__(
        self,
        poster: MatrixPoster,
        room: str | None,
        people: Mapping[str, Sequence[str]],
        outbox: Outbox[Message],
    ) -> None:
        super().__init__(poster.direct, room, people, outbox, "Matrix")
