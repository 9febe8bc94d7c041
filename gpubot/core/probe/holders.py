"""When the probe asks ``fuser`` who holds the GPUs' device files.

``fuser`` reads every process's open files, so its cost grows with the node's process count. It
matters where holders decide something (a reset, its checks, a sweep). A status only shows who
is on each GPU, so it runs ``fuser`` only when some GPU's memory does not add up, and a snapshot
that skipped it says so in a note: "device files not checked" is never silent.

The rule is decided twice: in bash on the node (``ADDS_UP``, so the probe stays one exec) and
here, where the parser checks the node's decision: a skip on memory that does not add up is a
``ParseError``. The bash side is the stricter one, so every skip it makes, Python accepts.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from gpubot.core.flags import NO_PROCESS_MEMORY_MIB
from gpubot.core.models import ComputeApp, GpuInfo


class Holders(StrEnum):
    """Whether a probe asks ``fuser`` for the device files' holders."""

    ALWAYS = "always"  # resets, readiness, verification, sweeps: holders decide
    IF_UNEXPLAINED = "if-unexplained"  # a status: only when some GPU's memory does not add up


NOT_CHECKED = (
    "device files not checked: nvidia-smi's processes account for all GPU memory, so fuser was "
    "not run (a holder without memory, e.g. in another PID namespace, is not shown)"
)


def memory_adds_up(gpus: Sequence[GpuInfo], apps: Sequence[ComputeApp]) -> bool:
    """Whether every GPU's used memory is its apps' within the driver's share; unknown never is."""
    if any(a.used_memory_mib is None for a in apps):
        return False
    held: dict[str, int] = {}
    for a in apps:
        held[a.gpu_uuid] = held.get(a.gpu_uuid, 0) + (a.used_memory_mib or 0)
    return all(
        g.memory_used_mib is not None
        and g.memory_used_mib <= held.get(g.uuid, 0) + NO_PROCESS_MEMORY_MIB
        for g in gpus
    )


# adds_up GPU_TABLE APPS_TABLE: the same rule in bash, over nvidia-smi's CSV answers (``index,
# uuid, pci.bus_id, mig.mode.current, name, memory.used, ...`` and ``pid, gpu_uuid,
# used_memory``, nounits). Any row of another shape, a value that is not a number, a GPU in MIG
# mode (its apps' memory is per instance): does not add up.
ADDS_UP = (
    r"""adds_up() {
  local line u x
  local -a F
  local -A held=()
  lines "$2"
  for line in "${L[@]}"; do
    [[ -n $line ]] || continue
    IFS=, F=($line); IFS=$' \t\n'
    (( ${#F[@]} == 3 )) || return 1
    u=${F[1]// /} x=${F[2]// /}
    num "$x" && [[ -n $u && $u != *[!A-Za-z0-9/-]* ]] || return 1
    held[$u]=$(( ${held[$u]:-0} + 10#$x ))
  done
  lines "$1"
  for line in "${L[@]}"; do
    [[ -n $line ]] || continue
    IFS=, F=($line); IFS=$' \t\n'
    (( ${#F[@]} == 8 )) || return 1
    u=${F[1]// /} x=${F[5]// /}
    [[ ${F[3]// /} != Enabled && -n $u && $u != *[!A-Za-z0-9/-]* ]] && num "$x" || return 1
    (( 10#$x <= ${held[$u]:-0} + NOPM )) || return 1
  done
  return 0
}
"""
).replace("NOPM", str(NO_PROCESS_MEMORY_MIB))
