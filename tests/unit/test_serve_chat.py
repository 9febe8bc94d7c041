"""``gpubot serve --chat`` takes a front end's name or ``both``; a list is refused saying the
word, and anything else is refused naming the choices."""

from __future__ import annotations

import pytest

from gpubot.cli import build_parser


def chat(value: str) -> str:
    args = build_parser("serve").parse_args(["serve", "--chat", value])
    return str(args.chat)


def test_a_front_end_or_both_is_taken() -> None:
    assert [chat("slack"), chat("matrix"), chat("both")] == ["slack", "matrix", "both"]


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("slack,matrix", "'slack,matrix': to serve Slack and Matrix, say --chat both"),
        ("teams", "'teams': expected one of slack, matrix, both"),
    ],
)
def test_another_word_is_refused_in_one_line(
    value: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        chat(value)
    assert stop.value.code == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert said in line and "Traceback" not in line
