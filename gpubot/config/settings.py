"""The settings, as one frozen object (``Settings``), passed down through constructors.

Built only by ``gpubot.config.parse``, which validates every table; each field is typed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpubot.core.claims.rules import ClaimSettings
from gpubot.core.findings import SweepConfig
from gpubot.core.maint import MaintSettings
from gpubot.core.models import NodeConfig
from gpubot.core.policy import Policy
from gpubot.core.reset.protect import DEFAULT_DAEMON_PATHS, DEFAULT_SYSTEM_USERS, Protection
from gpubot.core.slurm import SlurmSettings
from gpubot.core.telemetry import PromSettings
from gpubot.core.usage.ladder import LadderRule
from gpubot.core.usage.report import ReportSettings


@dataclass(frozen=True)
class SshSettings:
    """How gpubot reaches nodes."""

    known_hosts: str = "~/.ssh/known_hosts"
    connect_timeout_s: float = 5.0
    command_timeout_s: float = 20.0
    max_parallel: int = 64
    keepalive_s: float = 15.0


@dataclass(frozen=True)
class ResetSettings:
    """Defaults of the reset engine."""

    grace_s: float = 10.0
    verify_timeout_s: float = 30.0
    free_threshold_mib: int = 256
    poll_interval_s: float = 0.25
    protected: tuple[str, ...] = DEFAULT_DAEMON_PATHS  # daemon executables, absolute paths
    system_users: tuple[str, ...] = DEFAULT_SYSTEM_USERS  # the accounts they must run as
    # gpu-reset of a GPU a daemon holds (persistence mode): nvidia-smi -pm 0 before, -pm 1 after
    toggle_persistence: bool = False
    # A respawned workload: run its stop command (docker stop, scancel, systemctl stop) as part
    # of the reset. False: gpubot only says which command stops it.
    stop_workloads: bool = False
    # A GPU whose target's workload may start it again (a restart policy, a pod, a job, a
    # service) is called freed only once it has stayed free this long.
    respawn_watch_s: float = 3.0
    # `/gpu diag`: how long dcgmi diag may run at each level before it is stopped
    diag_quick_s: float = 120.0
    diag_medium_s: float = 600.0

    @property
    def protection(self) -> Protection:
        """Return the protected-daemon rule (see ``core.reset.protect``)."""
        return Protection(self.protected, self.system_users)


@dataclass(frozen=True)
class AuditSettings:
    publish_head_every_s: float | None = 86400.0  # post the chain head this often; None: never
    # With $GPUBOT_AUDIT_KEY: a keyed seal record this often while gpubot serve runs (and after
    # every forced action); None: no seals.
    seal_every_s: float | None = 900.0
    # ``audit verify`` fails when the newest seal is older than this; None: twice the interval
    # the seal itself records. ``check_seals`` False: seal age is not checked ("off").
    max_seal_age_s: float | None = None
    check_seals: bool = True
    head_file: str | None = None  # the chain head, written after every write, outside the DB


@dataclass(frozen=True)
class AttributionSettings:
    """The ``[attribution]`` settings: who a container belongs to, and how long lookups take."""

    # A container belongs to the Linux user this label names; None: every container is root's.
    container_owner_label: str | None = None
    lookup_timeout_s: float = 5.0  # each runtime lookup (docker inspect ...) on a node


@dataclass(frozen=True)
class LeaseSettings:
    """The ``[leases]`` settings: how long a lease on exclusive work (a node's reset, the
    sweep) lasts without renewal, and how often its holder renews it while the work runs."""

    ttl_s: float = 30.0  # a dead holder's lease is taken over this long after its last renewal
    renew_s: float = 5.0  # at most half the ttl: one missed renewal never loses the lease


@dataclass(frozen=True)
class MetricsSettings:
    """The ``[metrics]`` settings: where ``gpubot serve`` serves Prometheus metrics."""

    port: int | None = None  # None: not served (unless ``--metrics-port``); 0: any free port
    host: str = "127.0.0.1"


@dataclass(frozen=True)
class CliSettings:
    """``[cli]``: ``gpubot status`` prints one line per node above ``summary_above`` nodes."""

    summary_above: int = 8  # 0: the summary always (``--tables`` shows the per-GPU tables)


@dataclass(frozen=True)
class Settings:
    path: str | None = None
    database_url: str = "sqlite:///gpubot.db"
    ssh: SshSettings = field(default_factory=SshSettings)
    reset: ResetSettings = field(default_factory=ResetSettings)
    nodes: tuple[NodeConfig, ...] = ()
    audit: AuditSettings = field(default_factory=AuditSettings)
    attribution: AttributionSettings = field(default_factory=AttributionSettings)
    # the front end's channels, [users], [approvals], [permissions] (system_users: [reset]'s)
    policy: Policy = field(default_factory=Policy)
    sweep: SweepConfig = field(default_factory=SweepConfig)  # [sweep] and [alerts]
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    leases: LeaseSettings = field(default_factory=LeaseSettings)
    cli: CliSettings = field(default_factory=CliSettings)
    reports: ReportSettings = field(default_factory=ReportSettings)  # [teams], [reports]
    ladder: LadderRule = field(default_factory=LadderRule)  # [idle]: the reclaim ladder
    claims: ClaimSettings = field(default_factory=ClaimSettings)  # [claims]
    maint: MaintSettings = field(default_factory=MaintSettings)  # [maint]
    slurm: SlurmSettings = field(default_factory=SlurmSettings)  # [slurm]
    prometheus: PromSettings = field(default_factory=PromSettings)  # [prometheus]

    def node(self, name: str) -> NodeConfig | None:
        return next((n for n in self.nodes if n.name == name), None)

    def groups(self) -> dict[str, tuple[str, ...]]:
        out: dict[str, list[str]] = {}
        for n in self.nodes:
            for g in n.groups:
                out.setdefault(g, []).append(n.name)
        return {g: tuple(ns) for g, ns in out.items()}
