"""The forms of Matrix ids, which the settings file's people take (``[users]``, approvers).

Only ``re`` here: the settings load without the front end. Matrix is not the primary front end
(its rooms are named in ``[matrix]``, not in the primary's channels), so importing this lets
``@alice:lab.example`` stand wherever a person's id does.
"""

from __future__ import annotations

import re

from gpubot.config.front_ends import IdForms, register
from gpubot.core.alerting import MessageRef

# A user id (@localpart:server): the spec's historical local parts are wider than today's, and a
# server name may carry a port.
USER = re.compile(r"@[!-9;-~]{1,200}:[A-Za-z0-9.-]{1,200}(:[0-9]{1,5})?")
# A room id: !opaque:server, or (room version 12 on) !hash of its create event, no server.
ROOM = re.compile(r"![A-Za-z0-9._~=+-]{1,255}(:[A-Za-z0-9.-]{1,200}(:[0-9]{1,5})?)?")

MATRIX_IDS = IdForms(
    "matrix",
    user=USER,
    group=re.compile(r"\+[!-9;-~]{1,200}:[A-Za-z0-9.-]{1,200}"),  # a community (unused)
    place=ROOM,
    user_words="a Matrix user id (@name:server)",
    group_words="a Matrix group (+name:server)",
    place_words="a Matrix room id (!id:server, or !id)",
    primary=False,
)
register(MATRIX_IDS)


def server_of(user_id: str) -> str:
    """Return the homeserver part of a user id (``lab.example`` of ``@alice:lab.example``)."""
    return user_id.partition(":")[2]


def ref_of(room: str, event_id: str) -> MessageRef:
    """Return the reference "ROOM/EVENT" of an event (a room id holds no slash)."""
    return MessageRef(f"{room}/{event_id}")


def split_ref(where: str) -> tuple[str, str | None]:
    """Return the room and event id of a reference (a bare room: no event)."""
    room, _, event = where.partition("/")
    return room, event or None
