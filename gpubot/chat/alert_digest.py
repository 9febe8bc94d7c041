"""A digest: one short alert message for one finding kind across nodes, so that a rack outage
is one message in the channel. Each finding's details and buttons are replies in its thread,
packed as many to a reply as the message limits allow; the channel message is updated in place
as findings resolve.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpubot.chat.alerts import (
    group_fallback,
    group_title,
    item_line,
    item_parts,
    item_place,
    render_alert_group,
    repeat_line,
)
from gpubot.chat.layout import MAX_FALLBACK, MAX_PARTS, Budget, clip
from gpubot.chat.message import Date, Heading, Message, Part, Section, Struck, Text, bold, ctx
from gpubot.core.alerting import AlertGroup, AlertItem

MAX_LISTED = 1500  # characters of the channel message's list of nodes; the rest are counted


def is_digest(group: AlertGroup) -> bool:
    """Whether ``group`` is a digest: its findings are on more than one node."""
    return len({i.key.node for i in group.items}) > 1


def render_alert(group: AlertGroup) -> Message:
    """Render the channel message of an alert group: a digest's short one, or a node's own."""
    return render_digest(group) if is_digest(group) else render_alert_group(group)


def _listed(items: Sequence[AlertItem], group: AlertGroup) -> tuple[str, str]:
    """Return the items' places joined ("node1, node2 GPU 0, …"), clipped; and how many more."""
    out: list[str] = []
    used = 0
    for item in items:
        where = item_place(item, group)
        if out and used + len(where) + 2 > MAX_LISTED:
            break
        out.append(where)
        used += len(where) + 2
    more = f" … and {len(items) - len(out)} more" if len(out) < len(items) else ""
    return ", ".join(out), more


def render_digest(group: AlertGroup) -> Message:
    """Render a digest's channel message: the title, the nodes, and where the details are."""
    title = group_title(group)
    open_ = group.open
    done = tuple(i for i in group.items if i.resolved_at is not None)
    said: list[Text] = []
    if open_:
        names, more = _listed(open_, group)
        said.append(("⚠ ", bold(f"open on {len(open_)}:"), f" {names}{more}"))
    if done:
        names, more = _listed(done, group)
        said.append(("✅ ", bold(f"resolved on {len(done)}:"), " ", Struck((names,)), more))
    parts: list[Part] = [Heading(title)]
    parts += [Section(t) for t in said]
    parts.append(ctx("Each node's details and buttons are in this message's thread."))
    if group.repeat_of is not None:
        parts.append(ctx(repeat_line(group.repeat_of)))
    parts.append(ctx(("gpubot sweep · ", Date(group.at.timestamp()))))
    return Message(title, tuple(parts[1:]), group_fallback(group, title))


def render_digest_details(group: AlertGroup) -> list[Message]:
    """Render a digest's thread replies: every finding's details and buttons, in few replies."""
    batches: list[list[Part]] = [[]]
    lines: list[list[str]] = [[]]
    room = MAX_PARTS - 1  # one part for the reply's heading line
    for item in group.items:
        section, acts = item_parts(item, group)
        need: list[Part] = [section] if acts is None else [section, acts]
        if len(batches[-1]) + len(need) > room:
            batches.append([])
            lines.append([])
        batches[-1] += need
        lines[-1].append(item_line(item, group))
    total = len(batches)
    out = []
    for n, (parts, said) in enumerate(zip(batches, lines, strict=True), 1):
        head = f"{group.node}: details" + (f" ({n} of {total})" if total > 1 else "")
        b = Budget()
        b.add(Section((bold(head),)))
        for part in parts:
            b.add(part)
        out.append(b.message(clip(f"{head}: " + "; ".join(said), MAX_FALLBACK)))
    return out
