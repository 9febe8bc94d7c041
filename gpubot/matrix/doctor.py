"""What ``gpubot doctor`` asks the Matrix homeserver, when the settings have ``[matrix]``: does
the URL answer the client-server API, is the token the bot's own on its device, and is the bot
in each configured room. Each failure is one line with the line that fixes it."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path

from gpubot.core.doctor.checks import Check, failed, passed
from gpubot.errors import ChatCallFailed, ConfigError
from gpubot.matrix.api import MatrixAccess, MatrixApi
from gpubot.matrix.serve import check_login
from gpubot.matrix.settings import MatrixSettings, parse

AREA = "matrix"
TIMEOUT_S = 10.0


def read(path: Path) -> dict[str, object] | None:
    """The settings file's tables (None: unreadable, which the settings checks say)."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return None


async def check_file(path: Path, environ: Mapping[str, str]) -> list[Check]:
    """The Matrix checks of the settings file ``path`` (none when it has no ``[matrix]``)."""
    raw = read(path)
    if raw is None:
        return []
    if "matrix" not in raw:
        return []
    try:
        m = parse(raw, str(path))
    except ConfigError as exc:
        return [failed(AREA, "settings", str(exc), "fix that key of [matrix]")]
    return await check(m, environ)


async def check(m: MatrixSettings, environ: Mapping[str, str]) -> list[Check]:
    try:
        token = m.token(environ)
    except ConfigError as exc:
        return [failed(AREA, "login", str(exc), f"export {m.token_env}=the bot's access token")]
    api = MatrixApi(MatrixAccess(m.homeserver, m.user_id, token, m.device_id, TIMEOUT_S))
    try:
        try:
            await check_login(api, m.token_env)
        except ConfigError as exc:
            said = str(exc)
            if said.startswith("matrix.homeserver"):
                fix = "set [matrix] homeserver to the URL of the homeserver's client-server API"
                return [failed(AREA, "homeserver", said, fix)]
            fix = (
                f"log {m.user_id} in with device_id {m.device_id!r}; put its token in {m.token_env}"
            )
            return [passed(AREA, "homeserver", m.homeserver), failed(AREA, "login", said, fix)]
        out = [passed(AREA, "homeserver", m.homeserver), passed(AREA, "login", m.user_id)]
        return out + await _rooms(api, m)
    finally:
        await api.close()


async def _rooms(api: MatrixApi, m: MatrixSettings) -> list[Check]:
    rooms = list(dict.fromkeys([*m.rooms, *([m.oncall_room] if m.oncall_room else [])]))
    if not rooms:
        fix = "name the rooms gpubot reads in [matrix] rooms"
        return [failed(AREA, "rooms", "no [matrix] rooms: only DMs would be read", fix)]
    try:
        joined = await api.joined_rooms()
    except ChatCallFailed as exc:
        return [failed(AREA, "rooms", f"cannot list the bot's rooms: {exc}", "try again")]
    fix = f"invite {m.user_id} to that room (/invite {m.user_id})"
    return [
        passed(AREA, f"room {r}", "the bot is in it")
        if r in joined
        else failed(AREA, f"room {r}", "the bot is not in it", fix)
        for r in rooms
    ]
