"""``gpubot demo`` and ``gpubot sim`` without the simulator: one line that says how to add it.

The simulator is a distribution of its own (``sim/``), which ``pip install gpubot`` leaves out.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpubot.cli import EXIT_ERROR, main

MISSING = "the simulated fleet (package gpusim) is not installed: pip install 'gpubot[demo]'"


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run ``gpubot ARGS`` in this process; return its one line of error."""
    capsys.readouterr()
    rc = main(list(args))
    out = capsys.readouterr()
    assert (rc, out.out) == (EXIT_ERROR, "")
    assert out.err.count("\n") == 1 and "Traceback" not in out.err, out.err
    assert out.err.startswith("gpubot: error: "), out.err
    return out.err


@pytest.mark.parametrize("args", [["demo"], ["sim", "up", "--dir", ".", "--nodes", "0"]])
def test_without_the_simulator_the_demo_says_so_in_one_line(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in [m for m in sys.modules if m == "gpusim" or m.startswith("gpusim.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "gpusim", None)  # import gpusim fails as if not installed
    assert MISSING in _run(capsys, *args)


def test_control_with_the_simulator_the_same_command_reaches_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Control: installed, the simulator answers the same bad input with its own error."""
    err = _run(capsys, "sim", "up", "--dir", str(tmp_path), "--nodes", "0")
    assert err == "gpubot: error: nodes must be 1-64, not 0\n"
