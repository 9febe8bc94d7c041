"""The titles of the GPU health findings (``core.health.findings``), as ``findings.TITLES`` has
them: in a module of their own so that ``findings`` registers them without importing the logic."""

from __future__ import annotations

from gpubot.core.models import FindingKind

HEALTH_TITLES: dict[FindingKind, str] = {
    FindingKind.MEMORY_REPAIR_PENDING: "GPU memory repair pending",
    FindingKind.REMAP_FAILED: "GPU row remapping failed",
    FindingKind.ECC_UNCORRECTED: "uncorrectable ECC errors growing",
    FindingKind.FABRIC_NOT_READY: "GPU fabric not ready",
    FindingKind.NVLINK_DOWN: "NVLink link down",
    FindingKind.GPU_THROTTLED: "GPU throttled",
}
# The kinds whose next step is gpubot's guarded gpu-reset (offered with the alert).
RESET_HEALTH_KINDS = frozenset(
    {FindingKind.MEMORY_REPAIR_PENDING, FindingKind.FABRIC_NOT_READY, FindingKind.NVLINK_DOWN}
)
