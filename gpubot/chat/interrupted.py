"""Interrupted actions in chat: the Home tab's and the sweep report's lines, and the "Mark
reviewed" button (only approvers see it and may use it; the review is an audit record).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from gpubot.chat.message import Action, Code, Part, Section, Sentence, Text, bold, ctx
from gpubot.core.policy import Person
from gpubot.core.ports import AuditLog
from gpubot.core.reset.interrupted import Unfinished, interrupted_line
from gpubot.errors import GpubotError, UsageError
from gpubot.services.approvals import ApprovalService

log = logging.getLogger(__name__)

ACTION_REVIEW = "gpubot_review_action"  # the value is the action id
MAX_SHOWN = 10  # interrupted actions detailed (one block each); the rest are counted


@dataclass(frozen=True)
class Interrupted:
    """The interrupted actions one person sees, and whether they may mark them reviewed."""

    actions: tuple[Unfinished, ...]
    may_review: bool = False


async def interrupted_for(
    audit: AuditLog | None, approvals: ApprovalService | None, who: Person | None
) -> Interrupted | None:
    """Return what was interrupted (every node) for ``who`` (None: no approver check); None
    when there is no audit log or it cannot be read (logged: the view still shows the rest)."""
    if audit is None:
        return None
    try:
        found = tuple(await audit.interrupted())
    except GpubotError as exc:
        log.warning("interrupted actions not listed: %s", exc)
        return None
    may = False
    if found and who is not None and who.refused is None and approvals is not None:
        try:
            may = await approvals.is_approver(who)
        except GpubotError as exc:  # the on-call group unreadable: no button this time
            log.warning("Home tab without review buttons: %s", exc)
    return Interrupted(found, may)


async def review(
    audit: AuditLog | None,
    approvals: ApprovalService | None,
    who: Person,
    value: str,
    *,
    source: str,
) -> str:
    """Mark the action ``value`` reviewed for ``who``; return a line saying what was done."""
    try:
        action_id = int(value)
    except ValueError:
        return f"not an action id: {value[:20]!r}"
    if audit is None or approvals is None:
        return "there is no audit log here: nothing was marked"
    try:
        if who.refused is not None or not await approvals.is_approver(who):
            return "only on-call approvers can mark interrupted actions reviewed"
        await audit.review_action(action_id, actor=who.id, source=source, note="Home tab")
    except UsageError as exc:
        return str(exc)
    except GpubotError as exc:
        return f"action {action_id} was not marked reviewed: {exc}"
    return f"action {action_id} marked reviewed by you (recorded in the audit log)"


def interrupted_parts(found: Interrupted | None, *, buttons: bool) -> list[Part]:
    """Return a part per interrupted action; ``buttons``: "Mark reviewed" where allowed."""
    if found is None or not found.actions:
        return []
    acts = found.actions
    head = (
        "⚠ ",
        bold(f"{len(acts)} interrupted action(s)"),
        ": gpubot stopped before recording their outcome. Check the node, then mark each reviewed.",
    )
    out: list[Part] = [Section(head)]
    for a in acts[:MAX_SHOWN]:
        mark = Action(ACTION_REVIEW, "Mark reviewed", str(a.id))
        out.append(Section(_line(a), mark if buttons and found.may_review else None))
    if len(acts) > MAX_SHOWN:
        out.append(ctx(_more(len(acts) - MAX_SHOWN)))
    return out


def _line(a: Unfinished) -> Text:
    return (Sentence(interrupted_line(a)),)


def _more(n: int) -> Text:
    return (f"… and {n} more: ", Code("gpubot audit list --incomplete"))


def sweep_lines(actions: Sequence[Unfinished]) -> list[Text]:
    """Return the sweep report's lines about interrupted actions."""
    out = [_line(a) for a in actions[:MAX_SHOWN]]
    if len(actions) > MAX_SHOWN:
        out.append(_more(len(actions) - MAX_SHOWN))
    return out
