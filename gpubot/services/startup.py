"""The start-up report: what a stopped gpubot left unfinished, told once through the front
end's ``Reporter`` and logged on one line.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from gpubot.core.approval.model import Approval
from gpubot.core.ports import Report, Reporter
from gpubot.core.reset.interrupted import Unfinished
from gpubot.services.approvals import ApprovalService

log = logging.getLogger(__name__)


class Incomplete(Protocol):
    """Where the actions without an outcome are (the audit store)."""

    async def incomplete_actions(self) -> Sequence[Unfinished]:
        """Return the actions with an intent and no outcome, newest first."""
        ...


async def report_interrupted(
    audit: Incomplete | None,
    approvals: ApprovalService | None,
    reporter: Reporter,
    source: str | None = None,
) -> list[Report]:
    """Tell which actions never recorded an outcome, then mark and tell the approved forced
    kills (of ``source``, the front end told, only: another's are its own) that never ended;
    return what was told."""
    told: list[Report] = []
    left = [] if audit is None else await audit.incomplete_actions()
    if left:
        told.append(await _tell(reporter, actions_report(left)))
    marked = [] if approvals is None else await approvals.abandon_approved(source=source)
    if marked:
        told.append(await _tell(reporter, approvals_report(marked)))
    return told


async def _tell(reporter: Reporter, report: Report) -> Report:
    log.warning("%s", report.text().replace("\n", " "))
    await reporter.report(report)
    return report


def actions_report(left: Sequence[Unfinished]) -> Report:
    lines = tuple(
        f"• #{a.id} {a.kind} on {a.node or '-'} by {a.actor}, started "
        f"{a.started_at:%Y-%m-%d %H:%M:%S} UTC: `{a.command}`"
        for a in left
    )
    head = (
        f"{len(left)} action(s) never recorded an outcome (gpubot stopped while running "
        "them); check those nodes"
    )
    return Report("Incomplete actions", head, lines, " (`gpubot audit list`)")


def approvals_report(marked: Sequence[Approval]) -> Report:
    head = (
        f"{len(marked)} approved forced kill(s) never recorded an end "
        "(gpubot stopped while running them), now marked incomplete; check those nodes"
    )
    return Report("Incomplete approvals", head, tuple(_approval_line(a) for a in marked))


def _approval_line(a: Approval) -> str:
    at = "" if a.decided_at is None else f" at {a.decided_at:%Y-%m-%d %H:%M:%S} UTC"
    return (
        f"• approval #{a.id} on {a.node}: asked by {a.requester_name or a.requester} "
        f"({a.requester}), approved by {a.decided_by_name or a.decided_by} ({a.decided_by})"
        f"{at}: `{a.request.command}`"
    )
