"""What Slurm says about a node: its state and the jobs allocated GPUs on it (issue 36).

The values here are neutral: the parsers (``core.slurm.parse``) fill them from
``scontrol ... --json``, ``squeue --json`` or ``slurmrestd`` of any OpenAPI version, and the
services compare them with what the probe saw. Text a job's owner chose (its name, a drain
reason someone typed) is kept printable-escaped (``core.text.one_line``).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpubot.core.runtimes import slurm as slurm_runtime

SLURM = slurm_runtime.KIND  # the scheduler, named as its runtime (``scheduler = "slurm"``)
SCHEDULERS = (SLURM,)  # what ``scheduler =`` of a node or group may name


@dataclass(frozen=True)
class SlurmSettings:
    """``[slurm]``: how long an allocated GPU may sit unused before it is a finding, whether
    claims are taken on nodes a scheduler owns, how long a read of Slurm may take, and the
    cluster's slurmrestd, if the site runs one (one serves every node of the cluster; its JWT
    comes from the environment variable ``restd_token_env``, never from the file)."""

    unused_after_s: float = 1800.0
    claims: bool = False  # False: a claim there is answered with how to ask Slurm
    timeout_s: float = 10.0
    restd_url: str | None = None  # "http://slurm-head:6820"; None: read over each node's SSH
    restd_user: str | None = None  # the X-SLURM-USER-NAME of every request
    restd_token_env: str = "SLURM_JWT"  # the environment variable holding the JWT


@dataclass(frozen=True)
class JobAlloc:
    """One job's allocation on one node: which GPUs (Slurm's GRES indices) it holds."""

    job_id: str  # "123", or "123_4" for an array task, "123+1" for a het component (shown)
    user: str  # the job's user, as Slurm names it
    name: str  # the job's name (its owner's text)
    state: str  # RUNNING, SUSPENDED, COMPLETING ...
    gpu_idx: tuple[int, ...]  # GRES indices of the gpu type on this node, sorted
    account: str | None = None
    start: float | None = None  # unix time the job started
    end: float | None = None  # unix time its limit ends; None: no limit (or unknown)
    # True: Slurm's answer did not say which GPUs the job holds here (``IDX:N/A``, ``CNT:``, an
    # entry that does not read); gpu_idx is then () and means nothing, never "no GPU"
    gpu_unknown: bool = False
    # The record's own numeric job id: what slurmstepd names its cgroups by (``job_42`` for the
    # array task 40_7 whose own id is 42). None: the display id is it.
    own_id: str | None = None

    @property
    def cgroup_id(self) -> str:
        return self.own_id or self.job_id


@dataclass(frozen=True)
class NodeState:
    """A node as Slurm holds it."""

    name: str  # Slurm's NodeName
    states: tuple[str, ...]  # base state then flags, upper case: ("IDLE", "DRAIN") ...
    reason: str | None = None  # why it is drained or down, as set
    reason_by: str | None = None  # who set the reason
    reason_at: float | None = None  # when (unix time)

    @property
    def drained(self) -> bool:
        """Whether Slurm schedules nothing new here (drain, down, fail)."""
        return bool({"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL"} & set(self.states))


@dataclass(frozen=True)
class GresMap:
    """Slurm's GRES index to GPU device minor on one node.

    ``proven``: the map comes from ``gres.conf`` ``File=`` lines of this node (each index a
    device file whose minor is known). Unproven, index ``i`` is taken as the ``i``-th GPU by
    device minor (Slurm's own order for ``File=/dev/nvidia[0-N]`` and for NVML autodetect), and
    every line that uses it says so.
    """

    minors: tuple[int, ...]  # minors[idx] is the device minor of GRES index idx
    proven: bool

    def minor(self, idx: int) -> int | None:
        return self.minors[idx] if 0 <= idx < len(self.minors) else None


@dataclass(frozen=True)
class SlurmView:
    """One node's view from Slurm at one moment."""

    node: NodeState | None  # None: Slurm does not know the node
    jobs: tuple[JobAlloc, ...]
    taken_at: float  # unix time it was read
    source: str  # "slurmrestd v0.0.38", "scontrol --json", ...
    gres: GresMap | None = None  # None: no GPU GRES map could be made
    error: str | None = None  # why Slurm could not be read (then nothing else is known)
    note: str | None = None  # one line on how it was read (a slurmrestd that failed, ...)

    def on_gpu(self, minor: int | None) -> JobAlloc | None:
        """Return the job allocated the GPU of device minor ``minor``, if one is."""
        if minor is None or self.gres is None:
            return None
        for job in self.jobs:
            if any(self.gres.minor(i) == minor for i in job.gpu_idx):
                return job
        return None
