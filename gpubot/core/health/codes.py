"""The one table of Xid and SXid codes: what each means, whose fault it is, and the next step.

Every entry cites where its meaning and action come from, NVIDIA's public documentation first
(the addresses are the constants below):

- CATALOG: NVIDIA, "Analyzing Xid Errors with the Xid Catalog" (Ampere and newer; the row of the
  code: mnemonic, description, "Resolution Bucket (Immediate Action)");
- XID_DOC: NVIDIA, "Xid Errors" (the older per-code table: possible causes);
- REMAP_DOC: NVIDIA, "Row Remapping" (a pending remap needs a GPU reset to take effect);
- FM_GUIDE: NVIDIA Fabric Manager User Guide, "NVSwitch errors" (SXid; a fatal SXid needs the
  GPUs and NVSwitches reset: the system restarted).

The catalog's buckets map onto gpubot's four steps: ``RESTART_APP`` is the job's own (tell its
owner), ``RESET_GPU`` is "reset when idle" (gpubot's guarded gpu-reset, through approval when
processes would die), ``RESTART_BM`` is "drain and reboot", ``CONTACT_SUPPORT`` is "hardware:
open a ticket". A repeat threshold turns a code that is one job's trouble when seen once into a
finding for on-call when it comes back ``burst`` times in the window on the same GPU (the
catalog's "Repeat ... to same GPU (via PCI-ID): possible HW issue", its WORKFLOW_XID_13/31).

On a node a scheduler owns, a code whose next step is "drain and reboot" offers to drain the node
(its alert's Drain button), and so do the codes that say the GPU should get no new job while it
waits for its fix (``drain_at``): a row that could not be remapped (Xid 64, once), and memory
errors that repeat on the same GPU in the window (Xid 48, 94, 95, ``DRAIN_REPEAT`` times). Their
next step stays as it is: on a node with no scheduler nothing else changes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

TELL_OWNER = "tell the job's owner"
RESET_WHEN_IDLE = "reset when idle"
DRAIN_REBOOT = "drain and reboot"
TICKET = "hardware: open a ticket"
LOOK_UP = "look it up in NVIDIA's Xid catalog"
QUIET = ""  # counted, never alerted below its threshold
DRAIN_P2P = "drain P2P: stop its peer-to-peer jobs, start none, then read its recovery action again"
DRAIN_RESET = "drain P2P, then reset when idle"
RECOVER_IMEX = "recover the node's IMEX domain"

CATALOG = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
XID_DOC = "https://docs.nvidia.com/deploy/xid-errors/index.html"
REMAP_DOC = "https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/row-remapping.html"
FM_GUIDE = "https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/index.html"
RECOVERY_DOC = (
    "https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/error-recovery-and-response-flags.html"
)
# The driver's words for each action: open-gpu-kernel-modules src/nvidia/src/kernel/gpu/gpu.c,
# _gpuRecoveryActionName (595.45.04); the numbers: NVML's nvmlDeviceGpuRecoveryAction_t.
RECOVERY_NAMES = "NVIDIA/open-gpu-kernel-modules src/nvidia/src/kernel/gpu/gpu.c"


@dataclass(frozen=True)
class XidClass:
    """One code: what it means, whose fault, the next step; past ``burst`` in the window, the
    step for on-call (``burst_step``)."""

    code: int
    name: str  # NVIDIA's mnemonic, or its description where it has none
    meaning: str
    fault: str  # application driver memory nvlink hardware gsp nvswitch unknown
    step: str  # one of the steps above (QUIET: counted only)
    source: str
    burst: int = 0  # this many in the window on one GPU: ``burst_step`` (0: no threshold)
    burst_step: str = RESET_WHEN_IDLE
    # this many in the window on one GPU: a scheduler's node may be drained for it (0: only
    # when its step is DRAIN_REBOOT)
    drain_at: int = 0

    @property
    def serious(self) -> bool:
        """Whether a GPU with this code recently is flagged unhealthy (not the job's own)."""
        return self.fault not in ("application", "unknown") and self.step != QUIET


DRAIN_REPEAT = 3  # memory errors on one GPU in the window that make its node's drain worth it


def _app(code: int, name: str, meaning: str) -> XidClass:
    return XidClass(code, name, meaning, "application", TELL_OWNER, f"{CATALOG} (Xid {code})", 5)


def _reset(
    code: int, name: str, meaning: str, fault: str, burst: int = 0, drain_at: int = 0
) -> XidClass:
    """A code whose catalog bucket is RESET_GPU; past ``burst`` (if any): drain and reboot."""
    source = f"{CATALOG} (Xid {code}: RESET_GPU)"
    then = DRAIN_REBOOT if burst else RESET_WHEN_IDLE
    return XidClass(code, name, meaning, fault, RESET_WHEN_IDLE, source, burst, then, drain_at)


XIDS: dict[int, XidClass] = {
    c.code: c
    for c in (
        _app(13, "ROBUST_CHANNEL_GR_EXCEPTION", "graphics engine exception (the job's kernel)"),
        _app(31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault (the job)"),
        _app(43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing (the job)"),
        _app(45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "channel cleaned up after earlier errors"),
        _app(69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "graphics engine class error"),
        _app(109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "context switch timeout"),
        XidClass(
            48,
            "ROBUST_CHANNEL_DBE_ERROR",
            "double-bit ECC error in GPU memory",
            "memory",
            RESET_WHEN_IDLE,
            f"{CATALOG} (Xid 48: RESET_GPU); {XID_DOC}",
            drain_at=DRAIN_REPEAT,
        ),
        _reset(61, "PMU_BREAKPOINT", "internal micro-controller breakpoint", "driver"),
        _reset(62, "PMU_HALT_ERROR", "internal micro-controller halt", "driver"),
        XidClass(
            63,
            "ECC_PAGE_RETIREMENT_OR_ROW_REMAPPING",
            "a memory row was marked for remapping: a GPU reset activates it",
            "memory",
            RESET_WHEN_IDLE,
            f"{CATALOG} (Xid 63); {REMAP_DOC}",
        ),
        XidClass(
            64,
            "ECC_PAGE_RETIREMENT_OR_ROW_REMAPPER_FAILURE",
            "a memory row could not be remapped",
            "memory",
            TICKET,
            f"{CATALOG} (Xid 64: CONTACT_SUPPORT); {REMAP_DOC}",
            drain_at=1,
        ),
        XidClass(
            74,
            "NVLINK_ERROR",
            "NVLink error",
            "nvlink",
            RESET_WHEN_IDLE,
            f"{CATALOG} (Xid 74: RESET_GPU, WORKFLOW_NVLINK_ERR)",
            burst=3,
            burst_step=TICKET,
        ),
        XidClass(
            79,
            "GPU_HAS_FALLEN_OFF_THE_BUS",
            "the GPU has fallen off the bus",
            "hardware",
            DRAIN_REBOOT,
            f"{CATALOG} (Xid 79: RESTART_BM); {XID_DOC}",
        ),
        XidClass(
            92,
            "EXCESSIVE_SBE_INTERRUPTS",
            "high single-bit ECC error rate",
            "memory",
            QUIET,
            f"{CATALOG} (Xid 92)",
            burst=3,
            burst_step=TICKET,
        ),
        XidClass(
            94,
            "ROBUST_CHANNEL_CONTAINED_ERROR",
            "contained ECC error: the job that hit it ended, the GPU needs a reset to remap",
            "memory",
            RESET_WHEN_IDLE,
            f"{CATALOG} (Xid 94: RESTART_APP, then RESET_GPU)",
            drain_at=DRAIN_REPEAT,
        ),
        _reset(
            95,
            "ROBUST_CHANNEL_UNCONTAINED_ERROR",
            "uncontained ECC error: every job on the GPU is affected",
            "memory",
            drain_at=DRAIN_REPEAT,
        ),
        _reset(
            119,
            "GSP_RPC_TIMEOUT",
            "timeout waiting for the GPU System Processor (GSP)",
            "gsp",
            burst=3,
        ),
        _reset(
            120,
            "GSP_ERROR",
            "error in code running on the GPU System Processor (GSP)",
            "gsp",
            burst=3,
        ),
        _reset(140, "UNRECOVERABLE_ECC_ERROR", "unrecovered ECC error", "memory"),
        XidClass(
            154,
            "GPU_RECOVERY_ACTION_CHANGED",
            "the driver says the GPU needs a recovery action (the line does not say which)",
            "driver",
            DRAIN_REBOOT,
            f"{CATALOG} (Xid 154); the action it names: RECOVERY_ACTIONS",
        ),
    )
}
for _code in range(144, 151):  # Blackwell NVLink: NVLINK_*_ERROR
    XIDS[_code] = XidClass(
        _code,
        "NVLINK_ERROR",
        "NVLink error (Blackwell)",
        "nvlink",
        RESET_WHEN_IDLE,
        f"{CATALOG} (Xid {_code})",
        burst=3,
        burst_step=TICKET,
    )


@dataclass(frozen=True)
class RecoveryAction:
    """One recovery action an Xid 154 line names: NVML's number, the driver's words, gpubot's
    next step and what NVIDIA's guide says it means (cited per entry)."""

    number: int
    words: str  # exactly as the driver prints it
    step: str
    meaning: str
    source: str


RECOVERY_ACTIONS: dict[str, RecoveryAction] = {
    a.words: a
    for a in (
        RecoveryAction(
            0,
            "None",
            QUIET,
            "no recovery action is needed: the GPU can be used again",
            f"{RECOVERY_DOC} (None)",
        ),
        RecoveryAction(
            1,
            "GPU Reset Required",
            RESET_WHEN_IDLE,
            "the GPU needs a reset (its processes stopped, nvidia-smi -r); not a node reboot",
            f"{RECOVERY_DOC} (Reset)",
        ),
        RecoveryAction(
            2,
            "Node Reboot Required",
            DRAIN_REBOOT,
            "the fault may have left the OS inconsistent: reboot the node",
            f"{RECOVERY_DOC} (Reboot)",
        ),
        RecoveryAction(
            3,
            "Drain P2P",
            DRAIN_P2P,
            "all peer-to-peer traffic must be quiesced before the next action is known",
            f"{RECOVERY_DOC} (Drain P2P)",
        ),
        RecoveryAction(
            4,
            "Drain and Reset",
            DRAIN_RESET,
            "peer-to-peer traffic must be drained, then the GPU reset",
            f"{RECOVERY_DOC} (Drain and Reset); NVML: Drain P2P and Reset Gpu",
        ),
        RecoveryAction(
            5,
            "Recover IMEX Domain",
            RECOVER_IMEX,
            "the node's IMEX domain needs recovery, not this GPU",
            f"{RECOVERY_NAMES} (Recover IMEX Domain); NVML: Recover IMEX Domain",
        ),
    )
}
# "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)" (gpu.c), the whole
# text after the code: a user's process name never reaches it (the line names no process).
_RECOVERY = re.compile(
    r"GPU recovery action changed (?:from 0x[0-9a-fA-F]{1,8} \([A-Za-z0-9 ]{1,40}\) )?"
    r"to 0x([0-9a-fA-F]{1,8}) \(([A-Za-z0-9 ]{1,40})\)\s*"
)


def recovery_action(text: str) -> RecoveryAction | None:
    """Return the action an Xid 154 line's text names, when its number and words agree with the
    driver's table; else None (the catalog's default step stands)."""
    m = _RECOVERY.fullmatch(text)
    if m is None:
        return None
    action = RECOVERY_ACTIONS.get(m[2])
    return action if action is not None and action.number == int(m[1], 16) else None


def xid_class_named(code: int, text: str) -> XidClass:
    """Return the class of Xid ``code`` given the driver's words after it (``text``): an Xid 154
    takes the recovery action it names (a GPU reset is not a node reboot)."""
    cls = xid_class(code)
    action = recovery_action(text) if code == GPU_RECOVERY_ACTION_CHANGED else None
    if action is None:
        return cls
    meaning = f"the driver names the recovery action '{action.words}': {action.meaning}"
    return XidClass(code, cls.name, meaning, cls.fault, action.step, action.source)


GPU_RECOVERY_ACTION_CHANGED = 154


def xid_class(code: int) -> XidClass:
    """Return the class of Xid ``code`` (an unknown code: look it up, never guessed)."""
    known = XIDS.get(code)
    if known is not None:
        return known
    return XidClass(code, "UNKNOWN", "not in gpubot's table", "unknown", LOOK_UP, CATALOG)


def sxid_class(code: int, text: str) -> XidClass:
    """Return the class of NVSwitch SXid ``code``; ``text``: the driver's words after it.

    The switch driver writes "Non-fatal" or "Fatal" after most codes (FM_GUIDE); a non-fatal one
    is counted and becomes a ticket past its threshold, any other needs the system reset.
    """
    if "non-fatal" in text.lower():
        return XidClass(
            code,
            "SXID_NON_FATAL",
            "non-fatal NVSwitch error",
            "nvswitch",
            QUIET,
            FM_GUIDE,
            3,
            TICKET,
        )
    return XidClass(code, "SXID", "NVSwitch error", "nvswitch", DRAIN_REBOOT, FM_GUIDE)
