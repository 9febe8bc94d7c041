"""``… because REASON``: the reason is text after the first word ``because``, one line, capped,
and never options; unknown memory is never counted as 0 MiB."""

from __future__ import annotations

import pytest

from gpubot.chat.reset_view import held_memory
from gpubot.core import commands
from gpubot.core.commands import MAX_REASON, clean_reason, split_reason
from gpubot.core.reset.plan import ResetPlan, Target
from gpubot.errors import UsageError


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("reset node1 gpu 2", None),
        ("reset node1 gpu 2 because it hangs", "it hangs"),
        ("/gpu reset node1 BECAUSE  two\n lines\tand tabs", "two lines and tabs"),
        ("reset node1 because gpu 3 pid 1 user root grace 0", "gpu 3 pid 1 user root grace 0"),
        ("reset node1 because because", "because"),
        ("reset becauseful", None),  # a word that starts with it is not it
    ],
)
def test_split_reason(line: str, reason: str | None) -> None:
    assert split_reason(line)[1] == reason


def test_the_reason_never_becomes_options() -> None:
    cmd = commands.parse("reset node1 gpu 2 because the gpu hangs since 3 pm; user asked")
    assert cmd == commands.Reset("node1", gpus=(2,), reason="the gpu hangs since 3 pm; user asked")


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("reset node1 because hung pid 4242", "'pid 4242' follows 'because'"),
        ("reset node1 gpu 2 because gpu 3 pid 7 user root grace 0", "'gpu 3' follows"),
        ("reset node1 because pids=4,5", "'pids=4,5' follows"),
        ("reset node1 gpu 1 because --user alice", "'--user alice' follows"),
        ("reset node1 gpu 1 because user=alice", "'user=alice' follows"),
        ("reset node1 because stuck --grace 0", "'--grace 0' follows"),
    ],
)
def test_options_after_because_are_refused_not_dropped(line: str, said: str) -> None:
    """``reset node1 because hung pid 4242`` would reset every GPU of node1 (the pid read as
    the reason): refused, never a reset wider than the one meant."""
    with pytest.raises(UsageError, match=said) as err:
        commands.parse(line)
    assert "put the options before 'because'" in str(err.value)
    before = line.split(" because ")[0]
    plain = commands.parse(before)  # the control: the same line without a reason
    assert isinstance(plain, commands.Reset) and plain.reason is None
    assert commands.parse("reset node1 gpu 2") == commands.Reset("node1", gpus=(2,))


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ("reset node1 because", "nothing follows 'because'"),
        ("reset node1 because   ", "nothing follows 'because'"),
        ("status because x", "gives a reason to reset, drain or maint only"),
        ("because x", "a reason needs a command"),
    ],
)
def test_bad_reasons_get_one_line(line: str, error: str) -> None:
    with pytest.raises(UsageError, match=error):
        commands.parse(line)


def test_a_long_reason_is_capped() -> None:
    got = clean_reason("x" * 1000)
    assert got is not None and len(got) == MAX_REASON and got.endswith("…")
    assert clean_reason(" \n ") is None


def _plan(*mibs: int | None) -> ResetPlan:
    targets = tuple(Target(i + 2, 1, "bob", (0,), m, "c", ()) for i, m in enumerate(mibs))
    return ResetPlan("node1", (0,), targets, (), "alice")


@pytest.mark.parametrize(
    ("mibs", "said"),
    [
        ((3000,), "3000 MiB"),
        ((None,), "memory unknown"),
        ((1000, None, 2000), "≥ 3000 MiB + unknown"),
    ],
)
def test_unknown_memory_is_never_zero(mibs: tuple[int | None, ...], said: str) -> None:
    plan = _plan(*mibs)
    assert held_memory(plan) == said
    assert plan.unknown_mib == mibs.count(None)


def test_control_the_old_sum_says_zero_for_unknown_memory() -> None:
    assert f"{_plan(None).total_mib} MiB" == "0 MiB"  # what the request said before


def test_a_plan_without_a_reason_keeps_its_shape() -> None:
    plan = _plan(5)
    assert "reason" not in plan.to_dict()
    with_reason = ResetPlan.from_dict({**plan.to_dict(), "reason": "why"})
    assert with_reason.reason == "why" and with_reason.targets == plan.targets
    assert ResetPlan.from_dict(plan.to_dict()) == plan


def test_a_claims_note_may_say_because() -> None:
    """Only a reset or a drain takes a reason: a claim's note is free text, ``because`` and all."""
    got = commands.parse("/gpu claim node3 gpu 2 for 4h eval because the deadline is friday")
    assert getattr(got, "note", None) == "eval because the deadline is friday"
    with pytest.raises(
        UsageError, match="gives a reason to reset, drain or maint only"
    ):  # the control
        commands.parse("status node3 because the deadline is friday")
