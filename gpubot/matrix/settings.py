"""The ``[matrix]`` section: where the bot's homeserver is, who it is, and where it listens.

```toml
[matrix]
homeserver = "https://matrix.lab.example"
user_id = "@gpubot:lab.example"
token_env = "MATRIX_ACCESS_TOKEN"   # the variable holding the bot's access token
device_id = "GPUBOT"                # stable: the homeserver keys transaction ids by device
rooms = ["!ops:lab.example"]        # where commands are read and answered (and DMs)
oncall_room = "!oncall:lab.example" # where approval requests go (default: the first room)
alerts_room = "!alerts:lab.example" # where sweep alerts go (default: the first room)
servers = []                        # other homeservers whose users may use gpubot
```

The people are in the shared tables (``[users] "@alice:lab.example" = "alice"``, approvers).
Read by the entry that runs Matrix, from the same file, so a settings file without Matrix never
needs this module.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpubot.config import Settings
from gpubot.errors import ConfigError
from gpubot.matrix.ids import ROOM, USER

KEYS = {
    "homeserver",
    "user_id",
    "token_env",
    "device_id",
    "rooms",
    "oncall_room",
    "alerts_room",
    "servers",
}
URL = re.compile(r"https?://[^\s/?#]+(/[^\s?#]*)?")
DEVICE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
ENV = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
SERVER = re.compile(r"[A-Za-z0-9.-]{1,200}(:[0-9]{1,5})?")


@dataclass(frozen=True)
class MatrixSettings:
    homeserver: str
    user_id: str
    token_env: str = "MATRIX_ACCESS_TOKEN"
    device_id: str = "GPUBOT"
    rooms: tuple[str, ...] = ()
    oncall_room: str | None = None
    alerts_room: str | None = None
    servers: tuple[str, ...] = ()

    def token(self, environ: Mapping[str, str]) -> str:
        value = environ.get(self.token_env, "").strip()
        if not value:
            raise ConfigError(f"{self.token_env} is not set: the Matrix bot's access token")
        if any(c.isspace() for c in value):
            raise ConfigError(f"{self.token_env} is malformed: an access token has no spaces")
        return value


def _text(where: str, key: str, value: Any, form: re.Pattern[str], words: str) -> str:
    if not isinstance(value, str) or not form.fullmatch(value):
        raise ConfigError(f"{where}: matrix.{key}: expected {words}, got {value!r}")
    return value


def _list(where: str, key: str, value: Any, form: re.Pattern[str], words: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{where}: matrix.{key}: expected a list of {words}")
    return tuple(_text(where, key, v, form, words) for v in value)


def parse(raw: Mapping[str, Any], where: str) -> MatrixSettings:
    """Validate ``raw``'s ``[matrix]`` (a ``ConfigError`` naming the first bad key)."""
    t = raw.get("matrix")
    if not isinstance(t, Mapping):
        raise ConfigError(f"{where}: no [matrix] section: gpubot on Matrix needs one")
    unknown = sorted(set(t) - KEYS)
    if unknown:
        raise ConfigError(f"{where}: matrix.{unknown[0]}: unknown key")
    url = _text(where, "homeserver", t.get("homeserver"), URL, "http(s)://host")
    room_words = "Matrix room ids (!id:server, or !id)"
    oncall, alerts = t.get("oncall_room"), t.get("alerts_room")
    return MatrixSettings(
        homeserver=url.rstrip("/"),
        user_id=_text(where, "user_id", t.get("user_id"), USER, "a Matrix user id"),
        token_env=_text(
            where, "token_env", t.get("token_env", "MATRIX_ACCESS_TOKEN"), ENV, "a variable name"
        ),
        device_id=_text(where, "device_id", t.get("device_id", "GPUBOT"), DEVICE, "a device id"),
        rooms=_list(where, "rooms", t.get("rooms", []), ROOM, room_words),
        oncall_room=None
        if oncall is None
        else _text(where, "oncall_room", oncall, ROOM, "a room id"),
        alerts_room=None
        if alerts is None
        else _text(where, "alerts_room", alerts, ROOM, "a room id"),
        servers=_list(where, "servers", t.get("servers", []), SERVER, "homeserver names"),
    )


def load(path: Path) -> MatrixSettings:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    return parse(raw, str(path))


def on_matrix(settings: Settings, m: MatrixSettings) -> Settings:
    """Return ``settings`` whose rooms are Matrix's: answers, approval requests, sweep alerts,
    the weekly digest and the audit head go there."""
    first = m.rooms[0] if m.rooms else None
    policy = replace(settings.policy, channel=first, oncall_channel=m.oncall_room or first)
    sweep = replace(settings.sweep, channel=m.alerts_room or first)
    reports = replace(settings.reports, digest_channel=None)  # [reports]' is Slack's: the alerts'
    return replace(settings, policy=policy, sweep=sweep, reports=reports)
