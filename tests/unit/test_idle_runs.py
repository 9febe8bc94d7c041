"""core/idle_runs: a GPU's idle run folded sweep by sweep is the run its whole history gives."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from gpubot.core.usage.idle import GpuSample, held_idle, held_idle_since
from gpubot.core.usage.idle_runs import IdleRun, RunRule, advance, can_advance, kept_since

RULE = RunRule.of(4096, 450.0)
T0 = 1_750_000_000.0

# One step: how long after the last sample (a sweep, a missed one, the bot down, two sweeps
# overlapping), what the GPU said, and which card answers to the index (a node restarted).
STEP = st.tuples(
    st.sampled_from([300.0, 300.0, 300.0, 299.5, 450.0, 450.001, 600.0, 3600.0, 0.0, -120.0]),
    st.sampled_from([0, 0, 0, 0, 35, None]),
    st.sampled_from([8192, 8192, 8192, 4096, 4095, None]),
    st.sampled_from(["GPU-a", "GPU-a", "GPU-a", "GPU-b"]),
)


def history_of(steps: list[tuple[float, int | None, int | None, str]]) -> list[GpuSample]:
    t, out = T0, []
    for dt, util, mem, uuid in steps:
        t += dt
        out.append(GpuSample("n1", 0, uuid, t, util, mem))
    return out


def rebuild(samples: Iterable[GpuSample], rule: RunRule) -> IdleRun | None:
    """Return the run of one GPU from its samples in stored order (None: none): ``advance``
    folded over its whole history, a model of a rebuild. Of samples taken at the same time, as
    in ``held_idle_since``, the first stored decides whether the run reaches that time."""
    run: IdleRun | None = None
    ordered = sorted(samples, key=lambda s: s.taken_at)  # stable: ties keep their order
    i = 0
    while i < len(ordered):
        j = i
        while j < len(ordered) and ordered[j].taken_at == ordered[i].taken_at:
            j += 1
        first, tied = ordered[i], ordered[i:j]
        run = advance(run, first, rule)
        if run.idle_since is not None and not all(held_idle(s, rule.min_mib) for s in tied):
            run = replace(run, idle_since=first.taken_at)
        i = j
    return run


@settings(max_examples=300, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=60))
def test_folding_each_sample_gives_what_the_history_gives(steps: list) -> None:  # type: ignore[type-arg]
    samples = history_of(steps)
    runs: dict[str, IdleRun | None] = {}
    for i, s in enumerate(samples):
        earlier = samples[:i]
        run = runs.get(s.uuid)
        now: IdleRun | None
        after: IdleRun | None
        if can_advance(run, s, RULE):
            now = after = advance(run, s, RULE)
        else:  # out of order or the same time: rebuilt from the GPU's own samples
            mine = [h for h in earlier if h.key == s.key]
            now = rebuild([*(h for h in mine if h.taken_at < s.taken_at), s], RULE)
            after = rebuild([*mine, s], RULE)
        assert now is not None and after is not None
        runs[s.uuid] = after
        want = held_idle_since(earlier, s, min_mib=RULE.min_mib, max_gap_s=RULE.max_gap_s)
        assert now.idle_since == want, (i, s)


@given(st.lists(STEP, min_size=1, max_size=40))
def test_a_rebuilt_run_is_the_run_of_its_latest_sample(steps: list) -> None:  # type: ignore[type-arg]
    samples = [s for s in history_of(steps) if s.uuid == "GPU-a"]
    run = rebuild(samples, RULE)
    if not samples:
        assert run is None
        return
    assert run is not None
    latest = max(s.taken_at for s in samples)
    last = next(s for s in samples if s.taken_at == latest)
    assert run.last_at == latest
    want = held_idle_since(samples, last, min_mib=RULE.min_mib, max_gap_s=RULE.max_gap_s)
    assert run.idle_since == want


def test_a_run_under_another_rule_is_not_folded() -> None:
    s = GpuSample("n1", 0, "GPU-a", T0, 0, 8192)
    run = advance(None, s, RULE)
    later = GpuSample("n1", 0, "GPU-a", T0 + 300, 0, 8192)
    assert can_advance(run, later, RULE)
    assert not can_advance(run, later, RunRule.of(8192, 450.0))
    assert not can_advance(run, later, RunRule.of(4096, 900.0))
    assert not can_advance(run, s, RULE)  # the same time again


def test_a_run_older_than_the_samples_kept_starts_at_the_first_kept() -> None:
    assert kept_since(T0, T0 + 600, T0 + 900) == T0 + 600
    assert kept_since(T0 + 700, T0 + 600, T0 + 900) == T0 + 700
    assert kept_since(T0, None, T0 + 900) == T0 + 900
