"""core/findings, core/alerting, core/readiness: findings from snapshots, their keys, the
alert decisions, reset readiness (the [sweep] settings: ``test_config_tables``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import pytest

from gpubot.core.alerting import Notice, confirmed, notice, snooze_until, to_resolve
from gpubot.core.findings import (
    GONE,
    NODE_SLOW,
    NODE_UNREACHABLE,
    SMI_FAILED,
    FindingKey,
    FindingKind,
    NodeFailure,
    SweepConfig,
    classify_failure,
    find,
)
from gpubot.core.health.kinds import parse_key
from gpubot.core.models import GpuProcess, NodeSnapshot
from gpubot.core.reset.protect import Protection
from gpubot.core.reset.readiness import parse_modes, parse_topo_peers, readiness, ready_argv
from gpubot.core.usage.idle import IdleRule
from gpubot.core.workload import Workload, parse_cgroup
from gpubot.errors import (
    CommandTimeout,
    NodeUnreachable,
    ParseError,
    SmiFailed,
    SmiMissing,
    UsageError,
)
from tests.fixtures.node_samples import TOPO_MIXED, gpu, proc, snap

CFG = SweepConfig(orphan_threshold_mib=1024)
IDLE = replace(CFG, idle=IdleRule(min_mib=1024, hours=2.0))
PROTECTION = Protection(
    paths=("/usr/bin/nvidia-persistenced", "/usr/bin/nv-hostengine"),
    system_users=("root", "nvidia-dcgm"),
)
PERSISTENCED = "/usr/bin/nvidia-persistenced"


def daemon(
    pid: int, g: int = 0, *, user: str = "root", uid: int = 0, exe: str = PERSISTENCED, **kw: object
) -> GpuProcess:
    """A protected system daemon: a system account's real and effective uid, a daemon's exe."""
    name = exe.rsplit("/", 1)[-1][:15]
    return proc(pid, g, mem=None, visible=False, name=name, user=user, uid=uid, exe=exe, **kw)  # type: ignore[arg-type]


def kinds(found: tuple[object, ...]) -> list[tuple[int | None, str, str]]:
    return [(f.gpu, f.kind.value, f.holder) for f in found]  # type: ignore[attr-defined]


# --- findings --------------------------------------------------------------------------------

CASES = [
    ("healthy: a process using its memory", snap(gpu(0, 4096), procs=(proc(10),)), CFG, []),
    ("idle GPU, driver's own memory", snap(gpu(0, 300)), CFG, []),
    ("memory at the threshold is not orphaned", snap(gpu(0, 1024)), CFG, []),
    ("orphaned: memory, no process", snap(gpu(0, 8192)), CFG, [(0, "orphaned-vram", "")]),
    ("unknown memory is never orphaned", snap(gpu(0, None)), CFG, []),
    (
        "a persistence daemon does not hold memory",
        snap(gpu(0, 8192), procs=(daemon(5),)),
        CFG,
        [(0, "orphaned-vram", "")],
    ),
    (
        "a protected daemon is never a hidden holder",
        snap(
            gpu(0, 100),
            procs=(daemon(5, user="nvidia-dcgm", uid=990, exe="/usr/bin/nv-hostengine"),),
        ),
        CFG,
        [],
    ),
    (
        "a protected daemon in state D is not a zombie finding",
        snap(gpu(0, 100), procs=(daemon(5, state="D"),)),
        CFG,
        [],
    ),
    (
        "a user's job named like the daemon is a holder",
        snap(
            gpu(0, 8192),
            procs=(
                proc(
                    5,
                    mem=None,
                    visible=False,
                    name="nvidia-persistenced",
                    exe="/home/alice/nvidia-persistenced",
                ),
            ),
        ),
        CFG,
        [(0, "hidden-holder", "5:1000")],
    ),
    (
        "a user running the daemon's own executable is a holder",
        snap(
            gpu(0, 8192),
            procs=(proc(5, mem=None, visible=False, name="nvidia-persistenced", exe=PERSISTENCED),),
        ),
        CFG,
        [(0, "hidden-holder", "5:1000")],
    ),
    (
        "a setuid daemon started by a user is a holder",
        snap(gpu(0, 8192), procs=(daemon(5, real_uid=1000),)),
        CFG,
        [(0, "hidden-holder", "5:1000")],
    ),
    (
        "root with another executable is a holder",
        snap(gpu(0, 8192), procs=(daemon(5, exe="/usr/bin/python3"),)),
        CFG,
        [(0, "hidden-holder", "5:1000")],
    ),
    (
        "zombie: state Z",
        snap(gpu(0, 4096), procs=(proc(11, state="Z"),)),
        CFG,
        [(0, "zombie-process", "11:1000")],
    ),
    (
        "zombie: state D",
        snap(gpu(0, 4096), procs=(proc(12, state="D", wchan="uvm_wait"),)),
        CFG,
        [(0, "zombie-process", "12:1000")],
    ),
    (
        "zombie: listed by nvidia-smi, gone from /proc",
        snap(gpu(0, 4096), procs=(proc(13, state=None, ticks=None, holds=False),)),
        CFG,
        [(0, "zombie-process", f"13:{GONE}")],
    ),
    (
        "a zombie is not also orphaned memory",
        snap(gpu(0, 9000), procs=(proc(13, state=None, ticks=None, holds=False),)),
        CFG,
        [(0, "zombie-process", f"13:{GONE}")],
    ),
    (
        "hidden: holds the device file, not listed",
        snap(gpu(0, 2048), procs=(proc(14, mem=None, visible=False),)),
        CFG,
        [(0, "hidden-holder", "14:1000")],
    ),
    (
        "0 % in one snapshot is no idle holder: only samples over hours say so",
        snap(gpu(0, 4096, util=0), procs=(proc(15),)),
        IDLE,
        [],
    ),
    (
        "GPUs in index order, each on its own",
        snap(gpu(1, 8192), gpu(0, 4096), procs=(proc(16, g=0, state="Z"),)),
        CFG,
        [(0, "zombie-process", "16:1000"), (1, "orphaned-vram", "")],
    ),
]


@pytest.mark.parametrize(("what", "s", "cfg", "want"), CASES, ids=[c[0] for c in CASES])
def test_findings_table(what: str, s: NodeSnapshot, cfg: SweepConfig, want: list[object]) -> None:
    assert kinds(find([s], {}, cfg, protection=PROTECTION)) == want


def test_default_protection() -> None:
    """Without a protection, the default daemon paths and system users apply."""
    s = snap(gpu(0, 8192), procs=(daemon(5),))
    assert kinds(find([s], {}, CFG)) == [(0, "orphaned-vram", "")]
    nothing = Protection(paths=(), system_users=())
    assert kinds(find([s], {}, CFG, protection=nothing)) == [(0, "hidden-holder", "5:1000")]


def test_finding_details() -> None:
    cg = "0::/system.slice/docker-" + "ab" * 32 + ".scope"
    w = parse_cgroup(cg)
    (f,) = find(
        [snap(gpu(0, 100), procs=(proc(14, mem=None, visible=False, cgroup=cg, workload=w),))],
        {},
        CFG,
    )
    assert f.key == FindingKey("n1", 0, "hidden-holder", "14:1000")
    assert (f.pid, f.user, f.owner, f.workload) == (14, "alice", "alice", "docker:abababababab")
    assert "in docker:abababababab" in f.summary and "nvidia-smi does not list" in f.summary
    # the workload names the owner when root's side says so (a Slurm job's user)
    job = Workload("slurm", "88", name="train", owner="bob")
    (g,) = find(
        [snap(gpu(0, 100), procs=(proc(15, mem=None, visible=False, workload=job),))], {}, CFG
    )
    assert (g.user, g.owner, g.workload) == ("alice", "bob", "slurm:88")
    assert g.to_dict()["owner"] == "bob" and g.to_dict()["workload"] == "slurm:88"
    # a cgroup alone (no workload from the probe) names nothing: the probe decides, not a regex
    (h,) = find([snap(gpu(0, 100), procs=(proc(14, mem=None, visible=False, cgroup=cg),))], {}, CFG)
    assert h.workload is None and " in " not in h.summary
    (d,) = find([snap(gpu(0, 4096), procs=(proc(12, state="D", wchan="uvm_wait"),))], {}, CFG)
    assert "state D in uvm_wait" in d.summary and "4096 MiB" in d.summary
    (o,) = find([snap(gpu(3, 8192))], {}, CFG)
    assert (o.memory_mib, o.kind.heading) == (8192, "orphaned GPU memory")
    assert o.to_dict()["kind"] == "orphaned-vram"


def test_keys_are_stable_across_sweeps() -> None:
    a = find([snap(gpu(0, 4096), procs=(proc(11, state="Z"),))], {}, CFG)
    b = find(
        [replace(snap(gpu(0, 4000), procs=(proc(11, state="Z", mem=4000),)), taken_at=9.0)], {}, CFG
    )
    assert [f.key for f in a] == [f.key for f in b]
    # the same PID with another start time is another process: another finding
    c = find([snap(gpu(0, 4096), procs=(proc(11, state="Z", ticks=2000),))], {}, CFG)
    assert a[0].key != c[0].key


def test_node_failures() -> None:
    failures = {
        "n2": NodeFailure(NODE_UNREACHABLE, "connection refused"),
        "n3": NodeFailure(SMI_FAILED, "nvidia-smi hung: no answer in 5s"),
    }
    found = find([], failures, CFG)
    assert [(f.node, f.gpu, f.kind.value, f.summary) for f in found] == [
        ("n2", None, "node-unreachable", "connection refused"),
        ("n3", None, "smi-failed", "nvidia-smi hung: no answer in 5s"),
    ]


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (NodeUnreachable("n", "refused"), NODE_UNREACHABLE),
        (CommandTimeout("n", "no answer in 20s"), NODE_SLOW),
        (SmiFailed("n", "nvidia-smi hung"), SMI_FAILED),
        (SmiMissing("n", "not found"), SMI_FAILED),
        (ParseError("nvidia-smi output", "garbage"), SMI_FAILED),
    ],
)
def test_classify_failure(exc: Exception, kind: FindingKind) -> None:
    assert classify_failure(exc) is kind  # type: ignore[arg-type]


# --- decisions ---------------------------------------------------------------------------------

T0 = datetime(2025, 1, 6, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class State:
    first_seen: datetime = T0
    seen_count: int = 2
    alerted_at: datetime | None = None
    reminded_at: datetime | None = None
    snoozed_until: datetime | None = None
    resolved_at: datetime | None = None


H = timedelta(hours=1)
DECISIONS = [
    (
        "first sighting: wait for a second sweep",
        "orphaned-vram",
        State(seen_count=1),
        T0,
        Notice.NONE,
    ),
    ("second sweep: alert", "orphaned-vram", State(), T0, Notice.ALERT),
    (
        "alerted: quiet",
        "orphaned-vram",
        State(seen_count=9, alerted_at=T0),
        T0 + 5 * H,
        Notice.NONE,
    ),
    (
        "alerted 6 h ago: remind",
        "orphaned-vram",
        State(seen_count=9, alerted_at=T0),
        T0 + 6 * H,
        Notice.REMIND,
    ),
    (
        "reminded 1 h ago: quiet",
        "orphaned-vram",
        State(seen_count=99, alerted_at=T0, reminded_at=T0 + 6 * H),
        T0 + 7 * H,
        Notice.NONE,
    ),
    (
        "second reminder",
        "orphaned-vram",
        State(seen_count=99, alerted_at=T0, reminded_at=T0 + 6 * H),
        T0 + 12 * H,
        Notice.REMIND,
    ),
    (
        "snoozed before the alert: quiet",
        "zombie-process",
        State(snoozed_until=T0 + H),
        T0,
        Notice.NONE,
    ),
    (
        "snooze over before the alert: alert",
        "zombie-process",
        State(snoozed_until=T0 + H),
        T0 + H,
        Notice.ALERT,
    ),
    (
        "snoozed after the alert: quiet",
        "zombie-process",
        State(alerted_at=T0, snoozed_until=T0 + 2 * H),
        T0 + H,
        Notice.NONE,
    ),
    (
        "snooze ended: remind at its end",
        "zombie-process",
        State(alerted_at=T0, snoozed_until=T0 + 2 * H),
        T0 + 2 * H,
        Notice.REMIND,
    ),
    (
        "an old snooze does not remind early",
        "zombie-process",
        State(alerted_at=T0 + 3 * H, snoozed_until=T0 + 2 * H),
        T0 + 4 * H,
        Notice.NONE,
    ),
    (
        "idle holder seen once: wait for a second sweep",
        "idle-holder",
        State(seen_count=1),
        T0 + H,
        Notice.NONE,
    ),
    (
        "idle holder (its samples span the window) seen twice: alert",
        "idle-holder",
        State(),
        T0 + H,
        Notice.ALERT,
    ),
    ("resolved: never", "orphaned-vram", State(resolved_at=T0), T0, Notice.NONE),
]


@pytest.mark.parametrize(
    ("what", "kind", "state", "now", "want"), DECISIONS, ids=[d[0] for d in DECISIONS]
)
def test_notice_table(what: str, kind: str, state: State, now: datetime, want: Notice) -> None:
    assert notice(kind, state, now, IDLE) is want


def test_confirmed_needs_two_sweeps() -> None:
    assert not confirmed("orphaned-vram", State(seen_count=1))
    assert confirmed("orphaned-vram", State(seen_count=2))


def test_to_resolve() -> None:
    open_keys = [
        FindingKey("n1", 0, "orphaned-vram", ""),  # n1 answered, not found: clears
        FindingKey("n1", 1, "zombie-process", "5:9"),  # found again: stays
        FindingKey("n2", 0, "orphaned-vram", ""),  # n2 did not answer: nobody looked, stays
        FindingKey("n2", None, "smi-failed", ""),  # n2 fails another way now: clears
        FindingKey("n2", None, "node-unreachable", ""),  # still unreachable: found, stays
        FindingKey("n3", None, "node-unreachable", ""),  # n3 answers again: clears
        FindingKey("gone", 2, "hidden-holder", "1:2"),  # node removed from the inventory: clears
    ]
    found = {
        FindingKey("n1", 1, "zombie-process", "5:9"),
        FindingKey("n2", None, "node-unreachable", ""),
    }
    out = to_resolve(
        open_keys, found, answered={"n1", "n3"}, failed={"n2"}, configured={"n1", "n2", "n3"}
    )
    assert out == [open_keys[0], open_keys[3], open_keys[5], open_keys[6]]


def test_snooze_until() -> None:
    assert snooze_until(T0, "1h") == snooze_until(T0, "60m") == T0 + H
    assert snooze_until(T0, "1d") == snooze_until(T0, "24h") == T0 + 24 * H
    assert snooze_until(T0, "2h30m") == T0 + 2.5 * H


@pytest.mark.parametrize("choice", ["1w", "59m", "1d1s", "0s", "soon", ""])
def test_a_snooze_is_an_hour_to_a_day(choice: str) -> None:
    with pytest.raises(ValueError, match=r"^bad snooze .*: expected a duration from 1h to 1d$"):
        snooze_until(T0, choice)


# --- finding keys ------------------------------------------------------------------------------


def test_a_key_is_its_text_and_back() -> None:
    for key in (
        FindingKey("node3", 2, "orphaned-vram"),
        FindingKey("n", None, "gpu-lost", "0:1F"),
        FindingKey("node3", 0, "zombie-process", "4242:991"),
    ):
        assert parse_key(key.text()) == key
    assert (
        FindingKey("node3", None, "node-unreachable").text()
        == '["node3","-","node-unreachable",""]'
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nope", "not a finding key: 'nope'"),
        ("null", "not a finding key"),
        ('["n", "x", "orphaned-vram", ""]', "not a finding key"),
        ('["n", 0, "orphaned-vram"]', "not a finding key"),
        ('["n", 0, "hoarding", ""]', "not a finding kind: 'hoarding'"),
    ],
)
def test_a_key_that_is_not_one_is_a_usage_error(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_key(text)


# --- readiness ---------------------------------------------------------------------------------

TOPO_PCIE = (
    "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n"
    "GPU0\t X \tPHB\t0-15\t0\nGPU1\tPHB\t X \t0-15\t0\n\nLegend:\n\n  X    = Self\n"
)
_HGX_HEAD = "\t" + "\t".join(f"GPU{i}" for i in range(8)) + "\tCPU Affinity\tNUMA Affinity\n"
TOPO_HGX = _HGX_HEAD + "".join(
    f"GPU{i}\t" + "\t".join(" X " if j == i else "NV18" for j in range(8)) + "\t0-55\t0\n"
    for i in range(8)
)


def test_parse_topo() -> None:
    assert parse_topo_peers(TOPO_MIXED) == {0: (1,), 1: (0,), 2: (3,), 3: (2,)}
    assert parse_topo_peers(TOPO_PCIE) == {0: (), 1: ()}
    hgx = parse_topo_peers(TOPO_HGX)
    assert hgx is not None and hgx[5] == (0, 1, 2, 3, 4, 6, 7)
    # the same matrix with its tabs turned into spaces still parses
    assert parse_topo_peers(TOPO_MIXED.replace("\t", "   ")) == parse_topo_peers(TOPO_MIXED)
    for junk in ("", "Invalid combination of input arguments.", "GPU0 X"):
        assert parse_topo_peers(junk) is None


def test_parse_modes() -> None:
    text = "0, Disabled, Enabled\n1, [N/A], Disabled\ngarbage\n3, Enabled, [N/A]\n"
    assert parse_modes(text) == {
        0: ("Disabled", "Enabled"),
        1: ("not supported", "Disabled"),
        3: ("Enabled", None),
    }


def test_readiness_without_an_answer() -> None:
    (r,) = readiness(None, [4], None, why_unknown="no SSH answer in 5s").values()
    assert r.persistence_daemon == "unknown" and r.nvlink_peers is None
    assert r.lines()[2] == "NVLink peers: unknown (no SSH answer in 5s)"


def test_ready_sections_need_the_fixed_marker_on_its_own_line() -> None:
    good = f"@gpubot topo 0\n{TOPO_MIXED}\n@gpubot end\n"
    assert readiness(None, [0], good)[0].nvlink_peers == (1,)
    for bad in (
        f"\n{'f' * 32} topo 0\n{TOPO_MIXED}\n@gpubot end\n",  # the old nonce form
        f"\nx @gpubot topo 0\n{TOPO_MIXED}\n@gpubot end\n",  # not at the start of a line
        f"\n@GPUBOT topo 0\n{TOPO_MIXED}\n@gpubot end\n",
        f"\n@gpubot topo\n{TOPO_MIXED}\n@gpubot end\n",  # no status: unknown
        f"\n@gpubot topo 2\n{TOPO_MIXED}\n@gpubot end\n",  # topo failed
    ):
        assert readiness(None, [0], bad)[0].nvlink_peers is None, bad
    # a kind seen twice keeps its first section
    twice = f"\n@gpubot topo 2\n\n@gpubot topo 0\n{TOPO_MIXED}\n@gpubot end\n"
    r = readiness(None, [0], twice)[0]
    assert r.nvlink_peers is None and r.nvlink_note == "nvidia-smi topo -m is not available here"


@pytest.mark.parametrize("output", ["", "sh: 1: timeout: not found\n", "garbage"])
def test_readiness_of_output_without_any_marker_is_unknown(output: str) -> None:
    (r,) = readiness(None, [0], output).values()
    assert r.persistence_daemon == "unknown" and r.nvlink_peers is None and r.mig_mode is None


@pytest.mark.parametrize(
    ("pd", "daemon_line"),
    [("0\n 812\n", "running (pid 812)"), ("1\n\n", "not running"), ("x\n", "unknown")],
)
def test_readiness_persistence_daemon(pd: str, daemon_line: str) -> None:
    (r,) = readiness(None, [0], f"\n@gpubot persistenced {pd}@gpubot end\n").values()
    assert r.persistence_daemon == daemon_line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("nvidia-smi", [], 5.0), "GPU indices"),
        (("nvidia-smi", [-1], 5.0), "GPU indices"),
        (("nvidia-smi", [True], 5.0), "GPU indices"),
        (("nvidia-smi", ["0"], 5.0), "GPU indices"),
        (("nvidia-smi", [0], 0.0), "timeout_s"),
        (("nvidia-smi", [0], -1.0), "timeout_s"),
    ],
)
def test_ready_argv_refuses_bad_input(args: tuple[object, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ready_argv(*args)  # type: ignore[arg-type]


def test_ready_argv_passes_values_as_arguments() -> None:
    argv = ready_argv("/opt/nv smi; rm -rf /", [0, 3], 2.5)
    assert argv[:2] == ["sh", "-c"] and argv[4:] == ["/opt/nv smi; rm -rf /", "2.5", "0,3"]
    assert "/opt/nv smi" not in argv[2]  # the script is fixed text
