"""The ``[matrix]`` section: the example's parses, and each bad key is one line naming it."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gpubot.config import load
from gpubot.errors import ConfigError
from gpubot.matrix import settings as ms

EXAMPLE = Path(__file__).resolve().parents[2] / "gpubot.example.toml"


def test_the_example_names_matrix_rooms_and_people() -> None:
    m = ms.parse(tomllib.loads(EXAMPLE.read_text()), str(EXAMPLE))
    assert m.homeserver == "https://matrix.example.org" and m.device_id == "GPUBOT"
    assert m.rooms == ("!ops0123:example.org",) and m.oncall_room == "!oncall0456:example.org"
    s = ms.on_matrix(load(EXAMPLE), m)
    assert s.policy.approval_channel == "!oncall0456:example.org"
    assert s.policy.users["@bob:example.org"] == "bob"  # Matrix people map as Slack's do


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ({}, "matrix.homeserver: expected http(s)://host, got None"),
        ({"homeserver": "matrix.example.org"}, "matrix.homeserver: expected http(s)://host"),
        ({"user_id": "gpubot"}, "matrix.user_id: expected a Matrix user id, got 'gpubot'"),
        ({"rooms": "!a:b.c"}, "matrix.rooms: expected a list of Matrix room ids"),
        ({"rooms": ["#ops:b.c"]}, "matrix.rooms: expected Matrix room ids (!id:server, or !id)"),
        ({"device_id": "a b"}, "matrix.device_id: expected a device id"),
        ({"colour": "red"}, "matrix.colour: unknown key"),
        ({"alerts_room": "#alerts:b.c"}, "matrix.alerts_room: expected a room id, got '#al"),
    ],
)
def test_a_bad_matrix_key_is_one_line_naming_it(table: dict[str, object], words: str) -> None:
    good = {"homeserver": "https://hs.example", "user_id": "@bot:hs.example"}
    raw = {"matrix": {**good, **table}} if table else {"matrix": {}}
    with pytest.raises(ConfigError) as failed:
        ms.parse(raw, "f.toml")
    assert str(failed.value).startswith("f.toml: ") and words in str(failed.value)
    assert "\n" not in str(failed.value)


def test_alerts_go_to_the_alerts_room_else_the_first_room() -> None:
    raw = {"homeserver": "https://hs.example", "user_id": "@bot:hs.example", "rooms": ["!a:b"]}
    s = load(EXAMPLE)
    assert s.sweep.channel != "!a:b"
    first = ms.on_matrix(s, ms.parse({"matrix": raw}, "f.toml"))
    assert first.sweep.channel == "!a:b"
    alerts = ms.on_matrix(s, ms.parse({"matrix": {**raw, "alerts_room": "!al:b"}}, "f.toml"))
    assert alerts.sweep.channel == "!al:b" and alerts.policy.channel == "!a:b"


def test_a_room_id_of_room_version_12_has_no_server() -> None:
    raw = {"homeserver": "https://hs.example", "user_id": "@bot:hs.example"}
    room = "!Pwe2hEUV1gCZNv1ccHCFC29skO7eCmaLHrCd8nf_OZ8"  # as Synapse 1.163 makes them
    assert ms.parse({"matrix": {**raw, "rooms": [room]}}, "f.toml").rooms == (room,)


def test_a_token_comes_from_its_variable() -> None:
    m = ms.MatrixSettings("https://hs.example", "@bot:hs.example", token_env="T")
    assert m.token({"T": " syt_abc \n"}) == "syt_abc"
    with pytest.raises(ConfigError, match="T is not set"):
        m.token({})
