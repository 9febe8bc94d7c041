"""The pure parts of claims (issue 26): the command language, free GPUs, ``any N``'s choice,
intruders and their relative start, with tables of cases."""

from __future__ import annotations

import dataclasses

import pytest

from gpubot.core import commands
from gpubot.core.claims import commands as cc
from gpubot.core.claims.rules import (
    Claim,
    busy,
    cuda_visible,
    free_gpus,
    idle_rule,
    idle_step,
    intruders,
    pick,
)
from gpubot.core.models import GpuInfo, GpuProcess, NodeSnapshot
from gpubot.core.usage.idle import GpuSample, held_idle_since
from gpubot.errors import UsageError

T0 = 1_800_000_000.0


@pytest.mark.parametrize(
    ("line", "want"),
    [
        (
            "claim node3 gpu 2,3 for 4h train llama",
            cc.ClaimGpus("node3", (2, 3), 2, 14400.0, "train llama"),
        ),
        ("claim node3 any 2 for 90m", cc.ClaimGpus("node3", (), 2, 5400.0)),
        ("claim node3 gpus 3,2,3 for 1h30m", cc.ClaimGpus("node3", (2, 3), 2, 5400.0)),
        ("extend by 2h", cc.Extend(7200.0)),
        ("extend node3 gpu 2 by 1d", cc.Extend(86400.0, "node3", (2,))),
        ("release", cc.Release()),
        ("release node3 gpu 2", cc.Release("node3", (2,))),
        ("claims", cc.ListClaims("all")),
        ("claims mine", cc.ListClaims("mine")),
        ("claims node3", cc.ListClaims("node3")),
        ("wait node3", cc.WaitFor("node3")),
        ("wait node3 any 2 for 4h", cc.WaitFor("node3", (), 2, 14400.0)),
        ("wait node3 any for 4h", cc.WaitFor("node3", (), 1, 14400.0)),
        ("wait node3 gpu 1,2", cc.WaitFor("node3", (1, 2), 2)),
        ("queue", cc.Queue()),
        ("queue node3", cc.Queue("node3")),
        ("leave", cc.Leave()),
        ("leave 4", cc.Leave(4)),
        ("/gpu take 7", cc.Take(7)),
    ],
)
def test_parse(line: str, want: cc.ClaimCommand) -> None:
    assert commands.parse(line) == want


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("claim", "claim needs a node"),
        ("claim node3", "say which GPUs"),
        ("claim node3 gpu 2", "say for how long"),
        ("claim node3 gpu 2 for 0h", "bad duration '0h': expected a duration greater than zero"),
        ("claim node3 gpu 2 for 4x", "bad duration '4x'"),
        ("claim node3 gpu 999 for 1h", "bad GPU number '999'"),
        ("claim node3 any 0 for 1h", "bad count '0'"),
        ("claim n;de gpu 1 for 1h", "bad node name 'n;de'"),
        ("extend 2h", "say by how much"),
        ("release node3 gpu", "gpu needs a value"),
        ("claims a b", "unexpected 'b'"),
        ("wait node3 gpu 1 later", "unexpected 'later'"),
        ("take", "usage"),
        ("take x", "bad id 'x'"),
        ("claim node3 gpu 1 for 1h " + "x" * 201, "too long"),
    ],
)
def test_bad_input_is_one_line(line: str, said: str) -> None:
    with pytest.raises(UsageError) as exc:
        commands.parse(line)
    assert said in str(exc.value) and "\n" not in str(exc.value)


def _snap(*procs: GpuProcess, mib: tuple[int | None, ...] = (0, 0, 0, 0)) -> NodeSnapshot:
    gpus = tuple(
        GpuInfo(i, f"GPU-{i}", "H200", m, 143771, 0 if m == 0 else 50) for i, m in enumerate(mib)
    )
    return NodeSnapshot("node3", T0, gpus, procs)


def _proc(gpu: int, user: str | None, *, pid: int = 100, system: bool = False) -> GpuProcess:
    return GpuProcess(
        pid,
        gpu,
        2000,
        "python3",
        True,
        True,
        user=user,
        start_ticks=5,
        elapsed_s=600,
        system=system,
    )


def test_free_busy_and_pick() -> None:
    snap = _snap(_proc(1, "alice"), _proc(3, "root", system=True), mib=(0, 2000, 300, 100))
    assert [busy(snap, g, 256) for g in range(4)] == [False, True, True, False]
    assert free_gpus(snap, claimed=[0], below_mib=256) == (3,)  # 0 is claimed, 2 holds memory
    assert free_gpus(_snap(mib=(None, 0, 0, 0)), [], 256) == (1, 2, 3)  # unknown is not free
    assert pick((0, 2, 3), 2, {}) == (0, 2)
    assert pick((0, 2, 3), 2, {3: T0, 2: T0 - 50}) == (2, 3)  # the GPUs they used last
    assert pick((0, 2, 3), 4, {}) == ()
    assert cuda_visible(["GPU-a", "GPU-b"]) == "CUDA_VISIBLE_DEVICES=GPU-a,GPU-b"


def test_intruders_are_other_users_only() -> None:
    claim = Claim(1, "node3", 1, "GPU-1", "bob", "U0BOB", T0 - 300, T0 + 3600, "eval")
    snap = _snap(
        _proc(1, "alice", pid=7),
        _proc(1, "bob", pid=8),  # the claimant's own
        _proc(1, None, pid=9),  # unknown user: never accused
        _proc(1, "root", pid=10, system=True),  # a daemon
        _proc(2, "carol", pid=11),  # an unclaimed GPU
    )
    (i,) = intruders(snap, [claim])
    assert i.process.pid == 7 and i.relative() == "5m before the claim"
    f = i.finding()
    assert (f.kind.value, f.gpu, f.pid, f.user) == ("claim-intruder", 1, 7, "alice")
    assert "alice's pid 7 python3 on GPU 1, claimed by bob" in f.summary
    later = Claim(1, "node3", 1, "GPU-1", "bob", "U0BOB", T0 - 4000, T0 + 3600, "")
    assert intruders(snap, [later])[0].relative() == "56m after the claim"
    assert intruders(_snap(_proc(1, "alice")), []) == []
    near = Claim(1, "node3", 1, "GPU-1", "bob", "U0BOB", T0 - 602, T0 + 3600, "")
    assert intruders(snap, [near])[0].relative() == "as the claim began"


@pytest.mark.parametrize(
    "utils",
    [
        (0, 0, 0, 0),
        (0, 50, 0, 0, 0),
        (50, 0, None, 0, 0),
        (0, 0, 0, 30, 0),
        (0, 0, 0, 0, 0, 0, 0, 0),
    ],
)
@pytest.mark.parametrize("gaps", [(60.0,), (60.0, 400.0, 60.0), (200.0, 30.0)])
def test_the_idle_rule_from_the_run_is_the_history_s(
    utils: tuple[int | None, ...], gaps: tuple[float, ...]
) -> None:
    """The claims' idle run, folded look by look (what the duty stores), says what the whole
    history says (``core.usage.idle.held_idle_since``, the raw samples), after every look."""
    rule = idle_rule(120.0)  # a gap over 360 s ends a run
    claim = Claim(1, "node3", 1, "GPU-1", "bob", "U0BOB", T0, T0 + 86400, "")
    history: list[GpuSample] = []
    t = T0
    for i, u in enumerate(utils):
        t += gaps[i % len(gaps)]
        look = GpuSample("node3", 1, "GPU-1", t, u, 0 if u == 0 else 500)
        since, last = idle_step(claim, look, rule)
        claim = dataclasses.replace(claim, idle_since=since, idle_last_at=last)
        raw = held_idle_since(history, look, min_mib=0, max_gap_s=rule.max_gap_s)
        assert since == raw, (i, utils, gaps)
        history.append(look)
