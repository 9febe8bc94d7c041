"""The scripted transport: answers come from a function, not from a node (httpx's
``MockTransport`` is the model).

Every ``run`` is one ``Call`` given to the handler, which returns a result or raises as a real
transport would; the argv is checked as the real transports check it, and every call is kept.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from gpubot.core.models import CommandResult, NodeConfig
from gpubot.core.names import SUDO
from gpubot.core.nodelog import LOGGED_NAME
from gpubot.errors import TransportError
from gpubot.transport.ssh import check_argv

Handler = Callable[["Call"], CommandResult | Awaitable[CommandResult]]
Reply = CommandResult | TransportError  # what ``answer`` looks up: a result, or the error to raise


@dataclass(frozen=True)
class Call:
    """One command asked of the transport."""

    node: NodeConfig
    argv: tuple[str, ...]
    timeout: float | None

    @property
    def program(self) -> str:
        """The script's own name (``gpubot-probe`` for ``bash -c SCRIPT gpubot-probe ...``), or
        the program run (``argv[0]``), after any ``timeout ...`` or ``sudo -n`` prefix, or the
        ``gpubot-log`` wrapper that writes an action's node log line first (``nodelog``)."""
        argv = list(self.argv)
        if argv[:2] == ["sh", "-c"] and argv[3:4] == [LOGGED_NAME]:  # sh -c S gpubot-log LINE ...
            argv = argv[5:]
        if argv[:1] == ["timeout"]:  # timeout -k 1 SECONDS COMMAND ...
            argv = argv[4:]
        if tuple(argv[: len(SUDO)]) == SUDO:
            argv = argv[len(SUDO) :]
        if len(argv) > 3 and argv[0] in ("sh", "bash") and argv[1] == "-c":
            return argv[3]
        return argv[0] if argv else ""


def completed(
    argv: Sequence[str], stdout: str = "", stderr: str = "", exit_status: int = 0
) -> CommandResult:
    """Return the result of a command that ran to its end (exit status 0 unless given)."""
    return CommandResult(tuple(argv), exit_status, stdout, stderr)


class ScriptedTransport:
    """A transport whose every answer is ``handler``'s (implements ``Transport``)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.calls: list[Call] = []
        self.closed = False

    async def run(
        self, node: NodeConfig, argv: Sequence[str], *, timeout: float | None = None
    ) -> CommandResult:
        check_argv(argv)
        call = Call(node, tuple(argv), timeout)
        self.calls.append(call)
        got = self.handler(call)
        result = await got if inspect.isawaitable(got) else got
        if not isinstance(result, CommandResult):
            raise TypeError(f"the handler answered {type(result).__name__}, not a CommandResult")
        return result

    def programs(self, node: str | None = None) -> list[str]:
        """Return the program of every call so far (to ``node`` only, if given), in order."""
        return [c.program for c in self.calls if node is None or c.node.name == node]

    async def close(self) -> None:
        """Nothing is pooled; a closed transport still answers (as the real ones reconnect)."""
        self.closed = True


def answer(table: Mapping[str, Reply | Callable[[Call], Reply]]) -> Callable[[Call], CommandResult]:
    """Return a handler that looks up each call's ``program`` in ``table`` (a result, an error
    to raise, or a function of the call); a program not there is exit 127, as a shell says."""

    def handler(call: Call) -> CommandResult:
        found = table.get(call.program)
        reply = found(call) if callable(found) else found
        if reply is None:
            return completed(call.argv, stderr=f"{call.program}: not found\n", exit_status=127)
        if isinstance(reply, TransportError):
            raise reply
        return CommandResult(call.argv, reply.exit_status, reply.stdout, reply.stderr)

    return handler
