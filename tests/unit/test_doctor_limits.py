"""``gpubot doctor``'s descriptor line: the pure check over a table of limits (the command run
under a small limit with a large fleet: ``tests/integration/test_doctor_limits_run.py``)."""

from __future__ import annotations

import pytest

from gpubot.core import fdbudget
from gpubot.core.doctor.limits import AREA, NAME, descriptor_check


@pytest.mark.parametrize(
    ("nodes", "soft", "hard", "ok", "shown"),
    [
        (1500, 1024, 1024, False, "soft 1024, hard 1024: 896 SSH connections for 1500 nodes"),
        (896, 1024, 1024, True, "soft 1024, hard 1024: 896 SSH connections for 896 nodes"),
        (897, 1024, 1024, False, "897 nodes"),
        (
            1500,
            1024,
            524288,
            True,
            "soft 1024, hard 524288 (raised to 524288 at start): 458752 SSH connections",
        ),
        (1, 1024, None, True, "hard unlimited (raised to 1048576 at start)"),
        (1, 1024, 1024, True, "for 1 node"),
        (0, 64, 64, True, "1 SSH connections for 0 nodes"),
        (2000, 16384, 16384, True, "14336 SSH connections for 2000 nodes"),
    ],
)
def test_the_line_says_the_limits_and_the_connections_they_allow(
    nodes: int, soft: int, hard: int | None, ok: bool, shown: str
) -> None:
    check = descriptor_check(nodes, soft, hard)
    assert (check.area, check.name, check.ok) == (AREA, NAME, ok)
    assert shown in check.detail
    assert bool(check.fix) == (not ok)


def test_a_limit_too_small_names_the_number_that_is_enough() -> None:
    check = descriptor_check(1500, 1024, 1024)
    want = fdbudget.needed(1500)
    assert f"LimitNOFILE={want} " in check.fix and f"ulimit -Hn {want}" in check.fix
    assert "closed and reopened" in check.detail
    assert descriptor_check(1500, want, want).ok  # the number given is enough ...
    assert not descriptor_check(1500, want - 1, want - 1).ok  # ... and the smallest that is
