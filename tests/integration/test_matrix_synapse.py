"""The Synapse fixture itself: it starts on loopback with the settings the Matrix tests need,
and one that cannot start fails with Synapse's own words."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.fixtures.daemons import StartError
from tests.fixtures.synapse import Synapse


async def test_synapse_serves_registered_users_reactions_and_many_logins(synapse: Synapse) -> None:
    alice = await synapse.register("fixture_alice")
    bob = await synapse.register("fixture_bob")
    assert alice.user_id == "@fixture_alice:lab.example"
    room = await alice.create_room(invite=(bob.user_id,))
    await bob.join(room)
    said = await bob.say(room, "hello")
    await alice.react(room, said, "✅")
    kinds = [(e["type"], e["sender"]) for e in await alice.events(room)]
    assert ("m.reaction", alice.user_id) in kinds and ("m.room.message", bob.user_id) in kinds
    # Synapse's default limits answer the 6th login from one address with a 429: raised here.
    for _ in range(8):
        assert await synapse.login(alice.user_id, alice.password, "GPUBOT")


def test_a_synapse_that_cannot_start_fails_with_its_own_log(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = Synapse(tmp_path, port=taken.getsockname()[1])
        with pytest.raises(StartError) as failed:
            server.start()
        server.stop()
    assert "synapse exited" in str(failed.value)
    assert "Address already in use" in str(failed.value)  # Synapse's words, from its log
