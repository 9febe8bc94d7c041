"""``gpubot serve --chat`` takes one front end: asked for two, it says how to serve both (one
process each on one database), and it names the front ends for anything else."""

from __future__ import annotations

import pytest

from gpubot.cli import build_parser


def chat(value: str) -> str:
    args = build_parser("serve").parse_args(["serve", "--chat", value])
    return str(args.chat)


@pytest.mark.parametrize("value", ["both", "slack,matrix"])
def test_two_front_ends_are_refused_saying_how_to_run_both(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        chat(value)
    assert stop.value.code == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if "error" in x]
    assert "gpubot serve --chat slack" in line and "--chat matrix --no-sweeps" in line
    assert "one database" in line and "Traceback" not in line


def test_one_front_end_is_taken_and_another_word_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert [chat("slack"), chat("matrix")] == ["slack", "matrix"]  # the control
    with pytest.raises(SystemExit):
        chat("teams")
    assert "'teams': expected one of slack, matrix" in capsys.readouterr().err
