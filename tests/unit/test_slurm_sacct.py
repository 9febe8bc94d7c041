"""GPU-hours by allocation: sacct's argv, the parse of its real output (tests/corpus/slurm/,
recorded here; see its README.md) and of hostile variants, and the window's clipping checked by
a brute force over minutes."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpubot.core.slurm.sacct import (
    FIELDS,
    Allocation,
    allocated_ms,
    gpus_of,
    parse_sacct,
    sacct_argv,
)

SLURM = Path(__file__).resolve().parent.parent / "corpus" / "slurm"
NODE = "gpusim27749x80d160"  # the recorded cluster's NodeName
T0 = 1796580556  # 2026-12-06T18:09:16Z: jobs 1-3 started
T4 = 1796580562  # job 4 started
HOUR = 1796580000  # 2026-12-06T18:00:00Z
NOW = 1796580563  # the recording's -E


def corpus(name: str) -> str:
    return (SLURM / name).read_text(encoding="utf-8")


def test_the_argv_asks_allocations_of_the_window_in_utc_and_no_job_name() -> None:
    argv = sacct_argv(HOUR, NOW + 0.9, ["node1", "gpu[1-2]"], 10.0)
    assert argv[:8] == [
        "timeout",
        "-k",
        "1",
        "10",
        "env",
        "TZ=UTC",
        "SLURM_TIME_FORMAT=%s",
        "sacct",
    ]
    assert argv[8:13] == ["-X", "-a", "-n", "-P", "--noconvert"]
    assert argv[13:17] == ["-S", "2026-12-06T18:00:00", "-E", "2026-12-06T18:09:23"]
    assert argv[17:19] == ["-N", "node1,gpu[1-2]"]
    assert argv[-1] == "--format=JobID,User,Account,AllocTRES,Start,End,State,NodeList"
    assert not any(f in argv[-1] for f in ("JobName", "Comment", "WorkDir"))
    assert "-N" not in sacct_argv(HOUR, NOW, [], 10.0)  # no node named: the whole cluster


def test_real_output_with_unix_times() -> None:
    read = parse_sacct(corpus("sacct-22.05-epoch.txt"), {NODE})
    assert (read.rows, read.skipped) == (5, 0)
    want = (
        Allocation("1", "gpusim-alice", "gpusim", 2.0, T0, T0 + 2, "COMPLETED"),
        Allocation("2", "gpusim-bob", "gpusim", 1.0, T0, T0 + 1, "COMPLETED"),
        Allocation("3", "gpusim-bob", "gpusim", 1.0, T0, T0, "CANCELLED"),
        Allocation("4", "gpusim-alice", "gpusim", 1.0, T4, None, "RUNNING"),
    )
    assert read.jobs == want  # job 5 has no gres/gpu: no GPU-hours
    hours = allocated_ms(read.jobs, HOUR, HOUR + 3600, NOW)
    assert hours == {"gpusim-alice": (2 * 2 + 1 * (NOW - T4)) * 1000, "gpusim-bob": 1000}


def test_real_output_with_iso_times_reads_the_same_as_utc() -> None:
    epoch = parse_sacct(corpus("sacct-22.05-epoch.txt"), {NODE})
    iso = parse_sacct(corpus("sacct-22.05-iso.txt"), {NODE})
    assert iso == epoch and len(iso.jobs) == 4


def test_a_node_outside_the_watched_ones_counts_no_gpu() -> None:
    read = parse_sacct(corpus("sacct-22.05-epoch.txt"), {"another"})
    assert read.jobs == () and read.skipped == 0
    assert len(parse_sacct(corpus("sacct-22.05-epoch.txt")).jobs) == 4  # the control: all


ROW = "7|alice|lab|billing=1,cpu=1,gres/gpu=2,node=1|1000|2000|COMPLETED|n1"


def one(line: str, watched: set[str] | None = None) -> tuple[Allocation, ...] | int:
    """Return the jobs of one line, or the count skipped when none read."""
    read = parse_sacct(line + "\n", watched)
    assert read.rows == 1
    return read.jobs if read.jobs else -read.skipped


def test_the_control_row_reads() -> None:
    assert one(ROW) == (Allocation("7", "alice", "lab", 2.0, 1000.0, 2000.0, "COMPLETED"),)


def test_a_bar_inside_a_field_is_skipped_never_read_shifted() -> None:
    assert one("7|ali|ce|lab|billing=1,gres/gpu=2|1000|2000|COMPLETED|n1") == -1
    assert one("7|alice|l|ab|gres/gpu=2|1000|2000|COMPLETED|n1") == -1
    assert one("7|alice||gres/gpu=2|1000|2000|COMPLETED|n1|") == -1
    assert one("7|alice|gres/gpu=2|1000|2000|COMPLETED|n1") == -1  # a field short


def test_hostile_values_are_skipped() -> None:
    bad = {
        "JobID": ["x7", "7;rm", "7_", ""],
        "User": ["", "al ice", "al\x1bice", "a" * 300],
        "Account": ["l ab", "l\x07ab"],
        "AllocTRES": ["gres/gpu=2,junk", "gres/gpu=99999999999", "gres/gpu=-2"],
        "Start": ["yesterday", "-5", "2026-13-45T99:00:00", "1e9"],
        "End": ["999", "soon"],  # 999: ends before it starts
        "State": ["running", "RUNNING;", ""],
        "NodeList": ["n[1-", "n[3-1]"],
    }
    for field, values in bad.items():
        for v in values:
            cells = ROW.split("|")
            cells[FIELDS.index(field)] = v
            line = "|".join(cells)
            if line.count("|") != len(FIELDS) - 1:
                continue
            assert one(line) == -1, (field, v)


def test_no_gpu_not_started_and_blank_lines_count_nothing() -> None:
    assert parse_sacct("").jobs == () and parse_sacct("\n \n").rows == 0
    assert parse_sacct(ROW.replace("gres/gpu=2,", "")).jobs == ()
    for unset in ("Unknown", "None"):
        assert parse_sacct(ROW.replace("|1000|", f"|{unset}|")).jobs == ()  # pending
    running = parse_sacct(ROW.replace("|2000|", "|Unknown|")).jobs
    assert running[0].end is None
    assert parse_sacct(ROW.replace("COMPLETED", "CANCELLED by 1000")).jobs[0].state == "CANCELLED"


def test_gpu_counts_of_alloc_tres() -> None:
    assert gpus_of("billing=1,cpu=1,gres/gpu=2,node=1") == 2
    assert gpus_of("gres/gpu:a100=2,gres/gpu=2") == 2  # the untyped count is the total
    assert gpus_of("gres/gpu:a100=1,gres/gpu:h100=2") == 3  # typed only: their sum
    assert gpus_of("gres/gpumem=4000,gres/gpuutil=50,cpu=1") == 0
    assert gpus_of("") == 0


def test_a_job_on_several_nodes_counts_its_share_on_the_watched_ones() -> None:
    row = ROW.replace("gres/gpu=2", "gres/gpu=8").replace("|n1", "|n[1-4]")
    assert one(row, {"n1", "n3"})[0].gpus == 4.0  # type: ignore[index]
    assert one(row, {"n9"}) == 0  # none watched: no row, nothing skipped
    assert one(row)[0].gpus == 8.0  # type: ignore[index]


MIN = 60


@st.composite
def jobs_and_window(draw: st.DrawFn) -> tuple[list[Allocation], int, int, int]:
    n = draw(st.integers(0, 6))
    jobs = []
    for i in range(n):
        start = draw(st.integers(0, 300))
        end = draw(st.one_of(st.none(), st.integers(start, 320)))
        gpus = draw(st.integers(1, 8))
        user = draw(st.sampled_from(["a", "b", "c"]))
        jobs.append(
            Allocation(
                str(i),
                user,
                "",
                float(gpus),
                start * MIN,
                None if end is None else end * MIN,
                "RUNNING" if end is None else "COMPLETED",
            )
        )
    since = draw(st.integers(0, 300))
    until = draw(st.integers(since + 1, 330))
    now = draw(st.integers(0, 330))
    return jobs, since, until, now


@settings(max_examples=300, deadline=None)
@given(jobs_and_window())
def test_clipping_to_the_window_equals_a_brute_force_over_minutes(
    case: tuple[list[Allocation], int, int, int],
) -> None:
    jobs, since, until, now = case
    want: dict[str, int] = {}
    for m in range(since, until):
        for j in jobs:
            end = now if j.end is None else j.end // MIN
            if j.start // MIN <= m < end and (j.end is not None or m < now):
                want[j.user] = want.get(j.user, 0) + int(j.gpus) * MIN * 1000
    got = allocated_ms(jobs, since * MIN, until * MIN, now * MIN)
    assert {u: ms for u, ms in got.items() if ms} == want
