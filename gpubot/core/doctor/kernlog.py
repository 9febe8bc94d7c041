"""``gpubot doctor``'s kernel-log check, for ``[sweep] kernel_log = true`` (pure).

It says which source the node's account may read with the sweep's own read, or the one line that
gives it one; gpubot never reads the kernel log through sudo.
"""

from __future__ import annotations

from gpubot.core.doctor.checks import Check, failed, passed
from gpubot.core.health.kernlog import KernelRead

NAME = "kernel log (Xid)"


def kernlog_check(area: str, user: str | None, read: KernelRead) -> Check:
    """Return the check of one node's kernel-log read."""
    if read.source == "journal":
        return passed(area, NAME, "journalctl -k is readable")
    if read.source == "dmesg":
        return passed(area, NAME, "dmesg is readable (no journal for this account)")
    who = user or "the SSH account"
    why = "; ".join(read.denied) or "neither journalctl -k nor dmesg answered"
    fix = (
        f"usermod -aG systemd-journal {who} on the node (or sysctl kernel.dmesg_restrict=0), "
        "or set [sweep] kernel_log = false"
    )
    return failed(area, NAME, why, fix)
