"""The GPU-hours report in chat: the first rows and what the figures rest on (the CSV is the
CLI's)."""

from __future__ import annotations

from datetime import datetime

from gpubot.chat.layout import MAX_TABLE_ROWS, Budget, clip, rows_of, table_fits, table_text
from gpubot.chat.message import Code, Heading, Message, Section, Table, ctx, italic
from gpubot.core.alerting import Lookup, Posted
from gpubot.core.usage.report import UsageReport
from gpubot.services.outbox import Outbox

SHOWN = 15  # rows a chat report shows


def render_usage(report: UsageReport, *, title: str = "GPU-hours") -> Message:
    """Render a GPU-hours report for chat (``title``: the weekly digest's own)."""
    title = f"{title} by {report.by} · {report.window.text()}"
    b = Budget()
    b.add(Heading(clip(title, 150)))
    rows = report.table()
    shown = rows[: min(SHOWN, MAX_TABLE_ROWS - 1) + 1]
    if len(rows) == 1:
        b.add(Section((italic("no GPU was sampled in this window"),)))
    elif table_fits(shown):
        b.add(Table(rows_of(shown), right=tuple(range(1, len(shown[0])))))
    else:
        b.add_pre(table_text(shown), reserve=2)
    more = len(rows) - len(shown)
    notes = report.notes()
    if more > 0:
        notes.append(f"… and {more} more row(s)")
    b.add(ctx(clip(" · ".join(n.strip() for n in notes[:6]), 1900)))
    b.add(ctx(("all of it: ", Code(f"gpubot report --by {report.by} --csv"))))
    return b.message(clip(title, 3000))


class ChannelDigest:
    """The weekly digest in one channel or room, posted and found through the outbox's poster
    (a ``services.digest.DigestNotifier``)."""

    def __init__(self, outbox: Outbox[Message], channel: str) -> None:
        self.outbox = outbox
        self.channel = channel

    async def post(self, report: UsageReport, *, token: str) -> Posted:
        msg = render_usage(report, title="Weekly GPU-hours")
        return await self.outbox.calls(self.channel, msg)[0](token, None)

    async def find(self, token: str, since: datetime) -> Lookup:
        return await self.outbox.finder(self.channel)(token, since)
