"""The node's ``logger -t gpubot`` line (``gpubot.core.nodelog``): its text, hostile names, and
what the scripts print about logger."""

from __future__ import annotations

import pytest

from gpubot.core.nodelog import (
    LOGGED_NAME,
    MAX_LINE,
    NO_MARKER,
    Attribution,
    TargetName,
    find_marker,
    line,
    logged_argv,
    parse_marker,
    quoted,
    signal_what,
    split_logged,
)
from gpubot.core.reset.signals import parse_signal_output
from gpubot.core.reset.stop_script import parse_stop_output

WHO = Attribution.of(
    "U0BOB",
    "bob",
    123,
    {"id": 7, "requester": "U0ALICE", "requester_name": "alice", "approver_name": "olga"},
)


def test_the_line_names_action_targets_who_approval_and_audit_number() -> None:
    what = signal_what("SIGTERM", [TargetName(4242, "alice", "python3 train.py")])
    assert line("reset", "node3", (2,), what, WHO) == (
        'reset node3 gpu 2: SIGTERM pid 4242 ("alice" "python3 train.py") by "bob" ("U0BOB"), '
        'requested by "alice", approved by "olga", request #7, audit #123'
    )
    # without an approval: who asked and the audit number only
    plain = Attribution.of("U0BOB", "U0BOB", 9)
    assert line("gpu-reset", "n1", (0,), "GPU reset", plain) == (
        'gpu-reset n1 gpu 0: GPU reset by "U0BOB", audit #9'
    )


@pytest.mark.parametrize(
    "name",
    [
        'x" by "root", audit #1',  # closes the quote and writes gpubot's own words
        "x\nreset node3 gpu 0: SIGKILL by root, audit #1",  # a second line
        "x\\",  # a trailing backslash that would escape the closing quote
        "\x1b[2Jx\u202e",  # terminal escapes, bidi override
    ],
)
def test_a_hostile_name_stays_one_quoted_part(name: str) -> None:
    got = line("reset", "n1", (0,), signal_what("SIGTERM", [TargetName(1, "eve", name)]), WHO)
    assert got.isprintable() and "\n" not in got
    assert got.endswith(
        '"bob" ("U0BOB"), requested by "alice", approved by "olga", request #7, audit #123'
    )
    part = quoted(name, 40)  # as signal_what quotes a name
    assert part in got
    # the quoted part ends at its first unescaped quote: exactly where it was put
    inner, i = part[1:], 0
    while inner[i] != '"':
        i += 2 if inner[i] == "\\" else 1
    assert i == len(inner) - 1


def test_quoting_escapes_and_the_control_without_it_forges() -> None:
    name = 'x" by "root'
    assert quoted(name) == '"x\\" by \\"root"'
    raw = f'pid 1 ("eve" "{name}")'  # the control: the same text unquoted reads as gpubot's
    assert ' by "root"' in raw and ' by "root"' not in signal_what("S", [TargetName(1, "e", name)])


def test_a_long_line_is_cut_but_keeps_its_attribution() -> None:
    many = [TargetName(p, "alice", "x" * 200) for p in range(100, 160)]
    got = line("reset", "n1", (0, 1), signal_what("SIGKILL", many), WHO)
    assert len(got) <= MAX_LINE and got.endswith("request #7, audit #123") and "…" in got


def test_a_node_or_name_with_nul_is_refused() -> None:
    with pytest.raises(ValueError):
        logged_argv("a\0b", ["true"])
    assert logged_argv("L", ["nvidia-smi", "-r"])[3:] == [LOGGED_NAME, "L", "nvidia-smi", "-r"]


def test_the_marker_is_read_and_kept_apart_from_the_answer() -> None:
    log, rest = split_logged("logger 0 \nGPU 00000000:18:00.0 was successfully reset.\n", "L")
    assert (log.ok, log.exit_status, rest) == (
        True,
        0,
        "GPU 00000000:18:00.0 was successfully reset.\n",
    )
    log, rest = split_logged("NodeName=n1 State=IDLE\n", "L")  # no marker: unknown, all kept
    assert (log.exit_status, rest) == (NO_MARKER, "NodeName=n1 State=IDLE\n")
    assert "unknown" in log.to_dict()["said"] and not log.ok
    failed = parse_marker("logger 1 logger: socket /dev/log: No such file or directory", "L")
    assert failed.to_dict() == {
        "line": "L",
        "ok": False,
        "exit_status": 1,
        "said": "logger: socket /dev/log: No such file or directory",
    }
    assert find_marker("12 sent\nlogger 124 \n", "L").exit_status == 124
    assert find_marker("12 sent\n", "L").exit_status == NO_MARKER


def test_the_scripts_parsers_accept_the_marker_and_nothing_else_new() -> None:
    assert parse_signal_output("12 sent\nlogger 0 \n")[12].status == "sent"
    check = parse_stop_output("checked 2 foreign 0\nlogger 1 no socket\nstopping\nlogger 0 x\n")
    assert check.stopping and check.logger == "logger 1 no socket"
    assert check.output == "logger 0 x"  # the stop's own output is never read as the marker
