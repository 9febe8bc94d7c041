"""The scripted transport (``gpubot.transport.scripted``): the ``Transport`` port answered by a
function, checked as the real transports check an argv."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gpubot.core.models import CommandResult, NodeConfig
from gpubot.core.ports import Transport
from gpubot.core.probe.snapshot import probe_argv
from gpubot.core.reset.signals import signal_argv
from gpubot.errors import AuthRefused, UsageError
from gpubot.transport import ScriptedTransport
from gpubot.transport.scripted import Call, Reply, answer, completed

NODE = NodeConfig(name="n1", host="n1.lab")


@pytest.mark.parametrize(
    ("argv", "program"),
    [
        (["nvidia-smi", "-L"], "nvidia-smi"),
        (["sudo", "-n", "nvidia-smi", "-r", "-i", "0"], "nvidia-smi"),
        (["timeout", "-k", "1", "5", "sudo", "-n", "docker", "inspect", "x"], "docker"),
        (["sh", "-c", "echo", "gpubot-signal", "TERM"], "gpubot-signal"),
        (probe_argv(NODE, smi_timeout_s=5), "gpubot-probe"),
        (signal_argv("TERM", [], sudo=True), "gpubot-signal"),
    ],
)
def test_a_call_names_its_program(argv: list[str], program: str) -> None:
    assert Call(NODE, tuple(argv), None).program == program


async def test_every_call_goes_to_the_handler_and_is_kept() -> None:
    seen: list[Call] = []

    async def handler(call: Call) -> CommandResult:  # an async handler is awaited
        seen.append(call)
        return completed(call.argv, stdout=f"{call.node.name}\n")

    transport: Transport = ScriptedTransport(handler)
    got = await transport.run(NODE, ["hostname"], timeout=3)
    assert got == CommandResult(("hostname",), 0, "n1\n", "")
    assert seen == [Call(NODE, ("hostname",), 3)]
    assert isinstance(transport, ScriptedTransport) and transport.calls == seen
    await transport.close()
    assert transport.closed


async def test_a_handlers_transport_error_is_raised_as_it_is() -> None:
    refused = AuthRefused("n1", "n1.lab:22 refused our key for gpubot")
    transport = ScriptedTransport(answer({"hostname": refused}))
    with pytest.raises(AuthRefused) as exc:
        await transport.run(NODE, ["hostname"])
    assert exc.value is refused and str(exc.value) == "n1: n1.lab:22 refused our key for gpubot"


async def test_the_table_answers_with_the_calls_argv() -> None:
    table: dict[str, Reply | Callable[[Call], Reply]] = {
        "uname": completed((), "Linux\n"),
        "id": lambda c: completed((), c.node.name),
    }
    transport = ScriptedTransport(answer(table))
    assert await transport.run(NODE, ["uname", "-s"]) == CommandResult(
        ("uname", "-s"), 0, "Linux\n", ""
    )
    assert (await transport.run(NODE, ["id"])).stdout == "n1"
    assert (await transport.run(NODE, ["who"])).exit_status == 127
    assert transport.programs() == ["uname", "id", "who"]
    assert transport.programs("n2") == []


@pytest.mark.parametrize(("argv", "message"), [([], "empty command"), (["a\0b"], "NUL byte")])
async def test_an_argv_no_exec_can_carry_is_refused_as_by_the_real_ones(
    argv: list[str], message: str
) -> None:
    transport = ScriptedTransport(answer({}))
    with pytest.raises(UsageError, match=message):
        await transport.run(NODE, argv)
    assert transport.calls == []


async def test_a_handler_answering_something_else_is_a_type_error() -> None:
    transport = ScriptedTransport(lambda call: "ok")  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="answered str, not a CommandResult"):
        await transport.run(NODE, ["true"])
