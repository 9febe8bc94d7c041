"""The ``/gpu …`` parser: tables of good and bad lines, and properties of arbitrary input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpubot.core import commands
from gpubot.core.names import NODE_NAME
from gpubot.errors import UsageError

GOOD = [
    ("", commands.Help()),
    ("/gpu", commands.Help()),
    ("help", commands.Help()),
    ("help reset", commands.Help("reset")),
    ("status", commands.Status()),
    ("/gpu status node1", commands.Status(("node1",))),
    ("STATUS all", commands.Status(("all",))),
    ("status node1 team-a", commands.Status(("node1", "team-a"))),
    ("  status\tnode1  ", commands.Status(("node1",))),
    ("reset node1", commands.Reset("node1")),
    ("reset node1 gpu 1", commands.Reset("node1", gpus=(1,))),
    ("reset node1 gpu 3,1,3", commands.Reset("node1", gpus=(1, 3))),
    ("reset node1 gpus=0,2", commands.Reset("node1", gpus=(0, 2))),
    ("reset node1 --gpu 2 --pid 4242", commands.Reset("node1", gpus=(2,), pids=(4242,))),
    ("reset node1 pid 10,11 grace 30", commands.Reset("node1", pids=(10, 11), grace_s=30.0)),
    ("reset node1 grace 2.5s", commands.Reset("node1", grace_s=2.5)),
    ("reset node1 grace=0", commands.Reset("node1", grace_s=0.0)),
    ("reset node1 grace 1m30s", commands.Reset("node1", grace_s=90.0)),
    ("reset node1 grace 0s", commands.Reset("node1", grace_s=0.0)),
    ("reset node1 user alice", commands.Reset("node1", user="alice")),
    ("gpu-reset node2 gpu 3", commands.GpuReset("node2", 3)),
    ("gpureset node2 gpu=3", commands.GpuReset("node2", 3)),
    ("drain node3", commands.Drain("node3")),
    ("/gpu drain node3 because xid 79 GPU 5", commands.Drain("node3", "xid 79 GPU 5")),
    ("DRAIN node3 BECAUSE  fabric\tnot ready ", commands.Drain("node3", "fabric not ready")),
    ("drain node3 because pid 4 gpu 2", commands.Drain("node3", "pid 4 gpu 2")),  # no options
    ("resume node3", commands.Resume("node3")),
    ("sweep", commands.Sweep()),
    ("audit", commands.Audit()),
    ("audit node1", commands.Audit("node1")),
    ("audit 25", commands.Audit(None, 25)),
    ("audit node1 5", commands.Audit("node1", 5)),
]


@pytest.mark.parametrize(("line", "want"), GOOD, ids=[g[0] or "<empty>" for g in GOOD])
def test_parses(line: str, want: commands.Command) -> None:
    assert commands.parse(line) == want


BAD = [
    ("stauts", "did you mean 'status'"),
    ("frobnicate", "unknown command 'frobnicate'"),
    ("reset", "reset needs a node"),
    ("reset node1;rm", "bad node name 'node1;rm'"),
    ("reset $(id)", "bad node name"),
    ("reset node1 gpu", "gpu needs a value"),
    ("reset node1 gpu x", "bad GPU number 'x'"),
    ("reset node1 gpu -1", "bad GPU number '-1'"),
    ("reset node1 gpu 1,,2", "bad GPU number ''"),
    ("reset node1 gpu 256", "bad GPU number '256'"),
    ("reset node1 gpu ١", "bad GPU number"),  # a non-ASCII digit
    ("reset node1 pid 1", "bad pid '1'"),
    ("reset node1 pid 99999999", "bad pid"),
    ("reset node1 grace 601", "bad grace '601'"),
    ("reset node1 grace 11m", "bad grace '11m'"),
    ("reset node1 grace 1x", "bad grace '1x'"),
    ("reset node1 grace -5", "bad grace"),
    ("reset node1 gpu 1 gpu 2", "gpu given twice"),
    ("reset node1 now", "unexpected 'now' after 'reset node1'"),
    ("reset node1 user Alice;", "bad user name"),
    ("reset node1 gpu " + ",".join(["1"] * 17), "too many values"),
    ("gpu-reset node1", "needs one GPU"),
    ("gpu-reset node1 gpu 1,2", "exactly one GPU"),
    ("gpu-reset node1 pid 4", "unexpected 'pid'"),
    ("drain", "drain needs a node"),
    ("drain node1;rm", "bad node name"),
    ("drain node1 xid 79", "unexpected 'xid' after 'drain'"),  # the reason needs 'because'
    ("drain node1 node2", "unexpected 'node2' after 'drain'"),
    ("drain node1 because", "nothing follows 'because'"),
    ("resume", "resume needs a node"),
    ("resume node1 now", "unexpected 'now' after 'resume'"),
    ("resume node1 because fixed", "reason to reset, drain or maint only"),
    ("sweep now", "unexpected 'now' after 'sweep'"),
    ("audit node1 0", "bad count '0'"),
    ("audit node1 101", "bad count"),
    ("audit node1 5 6", "unexpected '6'"),
    ("status node1 no|de", "bad node or group name"),
    ("approve 3", "use the Approve / Deny buttons"),
    ("status " + "a" * 300, "input too long"),
    ("status node1\x00", "control character"),
    ("status \x1b[31m", "control character"),
]


@pytest.mark.parametrize(("line", "message"), BAD, ids=[b[0][:30] for b in BAD])
def test_refuses_with_a_reason(line: str, message: str) -> None:
    with pytest.raises(UsageError, match=None) as exc:
        commands.parse(line)
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)


def test_decisions_only_where_admitted() -> None:
    assert commands.parse("approve 12", decisions=True) == commands.Decide(12, True)
    assert commands.parse("deny 7", decisions=True) == commands.Decide(7, False)
    with pytest.raises(UsageError, match="approval id"):
        commands.parse("approve x", decisions=True)
    with pytest.raises(UsageError, match="usage: approve ID"):
        commands.parse("approve", decisions=True)


def test_help_text() -> None:
    assert commands.help_text("reset") == commands.USAGE["reset"]
    assert commands.help_text("gpureset") == commands.USAGE["gpu-reset"]
    full = commands.help_text()
    assert all(u in full for u in commands.USAGE.values())
    assert "approve ID" not in full
    assert "approve ID" in commands.help_text(decisions=True)
    assert commands.help_text("nonsense") == full


def test_shared_vocabulary_helpers() -> None:
    assert commands.parse_gpus("2,0") == (0, 2)
    assert commands.parse("reset n1 pid 300,300") == commands.Reset("n1", pids=(300,))
    assert commands.parse_grace("10s") == 10.0
    assert commands.parse("status node-7.a") == commands.Status(("node-7.a",))
    with pytest.raises(UsageError, match="bad node or group name"):
        commands.parse("status -x")


@given(st.text(max_size=400))
def test_any_text_parses_or_says_why(text: str) -> None:
    try:
        cmd = commands.parse(text)
    except UsageError as exc:
        assert str(exc) and "\n" not in str(exc)
        assert len(str(exc)) < 400
        return
    # whatever was accepted only carries validated names and numbers
    for name in getattr(cmd, "names", ()) + tuple(
        n for n in (getattr(cmd, "node", None),) if n is not None
    ):
        assert NODE_NAME.fullmatch(name)
    for gpu in getattr(cmd, "gpus", ()):
        assert 0 <= gpu <= commands.MAX_GPU_INDEX


@given(
    st.sampled_from(["node1", "n-2", "box.a"]),
    st.lists(st.integers(0, 255), min_size=1, max_size=16),
    st.lists(st.integers(2, commands.MAX_PID), max_size=16),
    st.one_of(st.none(), st.integers(0, 600)),
)
def test_round_trip(node: str, gpus: list[int], pids: list[int], grace: int | None) -> None:
    line = f"reset {node} gpu {','.join(map(str, gpus))}"
    if pids:
        line += f" pid {','.join(map(str, pids))}"
    if grace is not None:
        line += f" grace {grace}"
    want = commands.Reset(
        node,
        tuple(sorted(set(gpus))),
        tuple(sorted(set(pids))),
        None,
        None if grace is None else float(grace),
    )
    assert commands.parse(line) == want
