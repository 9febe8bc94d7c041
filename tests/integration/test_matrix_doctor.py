"""``gpubot doctor`` on Matrix, against the real Synapse: it names a wrong homeserver URL, a
refused token and a room the bot is not in, each with its fix; a good setup passes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpubot.core.doctor.checks import Check
from gpubot.matrix.doctor import check, check_file
from gpubot.matrix.settings import MatrixSettings
from tests.fixtures.db import closed_port
from tests.fixtures.matrix import MatrixWorld, config_for
from tests.fixtures.serve import http_env, run_serve
from tests.fixtures.slack import FakeSlack

ENV = "MATRIX_ACCESS_TOKEN"


def failures(checks: list[Check]) -> list[tuple[str, str, str]]:
    return [(c.name, c.detail, c.fix or "") for c in checks if not c.ok]


async def test_a_good_setup_passes(matrix_world: MatrixWorld) -> None:
    w = matrix_world
    m = MatrixSettings(w.synapse.url, w.bot_id, rooms=(w.room,))
    checks = await check(m, {ENV: w.bot_token})
    assert failures(checks) == []
    assert [c.name for c in checks] == ["homeserver", "login", f"room {w.room}"]


async def test_the_doctor_names_a_wrong_url_a_bad_token_and_a_room_not_joined(
    matrix_world: MatrixWorld,
) -> None:
    w, closed = matrix_world, closed_port()
    nowhere = MatrixSettings(f"http://127.0.0.1:{closed}", w.bot_id, rooms=(w.room,))
    ((name, detail, fix),) = failures(await check(nowhere, {ENV: w.bot_token}))
    assert name == "homeserver" and f"127.0.0.1:{closed}: no answer" in detail
    assert "[matrix] homeserver" in fix

    m = MatrixSettings(w.synapse.url, w.bot_id, rooms=(w.room,))
    ((name, detail, fix),) = failures(await check(m, {ENV: "syt_not_a_token"}))
    assert (name, detail) == ("login", f"{ENV} was refused by the homeserver: M_UNKNOWN_TOKEN")
    assert "device_id 'GPUBOT'" in fix

    alice = w.users["alice"]
    elsewhere = await alice.create_room()  # the bot was never invited
    m = MatrixSettings(w.synapse.url, w.bot_id, rooms=(w.room,), oncall_room=elsewhere)
    ((name, detail, fix),) = failures(await check(m, {ENV: w.bot_token}))
    assert (name, detail) == (f"room {elsewhere}", "the bot is not in it")
    assert fix.startswith(f"invite {w.bot_id}")


async def test_a_file_without_matrix_has_no_matrix_checks(tmp_path: Path) -> None:
    path = tmp_path / "gpubot.toml"
    path.write_text('[database]\nurl = "sqlite:///x.db"\n')
    assert await check_file(path, {}) == []
    path.write_text('[matrix]\nhomeserver = "matrix.example.org"\n')
    ((name, detail, _),) = failures(await check_file(path, {}))
    assert name == "settings" and "matrix.homeserver: expected http(s)://host" in detail


@pytest.mark.parametrize("chat", ["matrix", "both"])
async def test_serve_refuses_a_bad_token_in_one_line(
    matrix_world: MatrixWorld, slack_fleet: Any, fake_slack: FakeSlack, tmp_path: Path, chat: str
) -> None:
    """Alone or beside Slack (whose token is good), a refused Matrix token stops the start
    before anything runs: one line."""
    w = matrix_world
    config = config_for(w, slack_fleet, tmp_path, w.synapse.url, slack=chat == "both")
    env = http_env(fake_slack, MATRIX_ACCESS_TOKEN="syt_not_a_token")
    port = str(closed_port())
    code, err = await run_serve(
        config, env, "--chat", chat, "--no-sweeps", "--http", "--port", port
    )
    assert code == 2
    assert err.strip().splitlines() == [
        f"gpubot: error: {ENV} was refused by the homeserver: M_UNKNOWN_TOKEN"
    ]
