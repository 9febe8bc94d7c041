"""The transports' one boundary map (``gpubot.transport.boundary.map_errors``)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from gpubot.errors import AuthRefused, CommandTimeout, NodeUnreachable, nearest
from gpubot.transport.boundary import ErrorMap, map_errors
from gpubot.transport.sshlib import asyncssh

TABLE: ErrorMap = {
    OSError: (NodeUnreachable, lambda exc: f"cannot connect: {exc.strerror or exc}"),
    TimeoutError: (CommandTimeout, "no answer in 5s"),
    asyncssh.Error: (NodeUnreachable, lambda exc: f"SSH failed: {exc.reason}"),
    asyncssh.PermissionDenied: (AuthRefused, "refused our key"),
}


@pytest.mark.parametrize(
    ("error", "kind", "message"),
    [
        (ConnectionRefusedError(111, "Connection refused"), NodeUnreachable, "cannot connect: Co"),
        (socket.gaierror(-2, "Name or service not known"), NodeUnreachable, "cannot connect: Na"),
        (TimeoutError(), CommandTimeout, "no answer in 5s"),  # nearer than OSError
        (asyncssh.ConnectionLost("gone"), NodeUnreachable, "SSH failed: gone"),
        (asyncssh.PermissionDenied("no"), AuthRefused, "refused our key"),  # nearer than Error
    ],
)
def test_the_nearest_class_in_the_mro_chooses(
    error: Exception, kind: type[Exception], message: str
) -> None:
    with pytest.raises(kind) as got, map_errors("node1", TABLE):
        raise error
    assert type(got.value) is kind and str(got.value).startswith(f"node1: {message}")
    assert got.value.__cause__ is error  # the library's error stays attached for the log


def test_the_order_of_a_table_does_not_matter() -> None:
    backwards: ErrorMap = dict(reversed(list(TABLE.items())))
    for table in (TABLE, backwards):
        with pytest.raises(CommandTimeout), map_errors("n", table):
            raise TimeoutError


@pytest.mark.parametrize(
    "mine",
    [
        NodeUnreachable("node1", "cannot connect to h:22: Connection refused"),  # an OSError too
        CommandTimeout("node1", "gpubot-probe: no answer in 30s"),  # a TimeoutError too
    ],
)
def test_gpubots_own_errors_pass_untouched(mine: Exception) -> None:
    assert nearest(type(mine), TABLE) is not None  # control: the table alone would remap it
    with pytest.raises(type(mine)) as got, map_errors("other", TABLE):
        raise mine
    assert got.value is mine


def test_what_the_table_does_not_name_passes_through() -> None:
    with pytest.raises(KeyError), map_errors("node1", TABLE):
        raise KeyError("x")


async def test_a_cancellation_is_never_mapped() -> None:
    async def cancelled() -> None:
        with map_errors("node1", {BaseException: (NodeUnreachable, "mapped")}):
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await cancelled()
