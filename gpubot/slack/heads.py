"""The audit chain's head, posted to the alerts channel on a schedule: a copy outside the database.

Anyone who can write the database can rewrite the log and recompute its hashes (without
``$GPUBOT_AUDIT_KEY``, undetectably). A head posted to Slack earlier cannot be rewritten with it:
``gpubot audit verify --expect-head SEQ:HASH`` checks the log still holds it. Each publication
walks the chain first, against the head this bot posted last, and posts what it found instead
of a head when the log does not verify.

``[audit] publish_head_every`` (default ``"24h"``, ``"off"`` to stop) sets the interval; the
first publication is a few seconds after start.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from gpubot.app import App
from gpubot.chat.blocks import Message, context, date, escape, header, section
from gpubot.config import Settings
from gpubot.core.findings import load_sweep_config
from gpubot.errors import GpubotError
from gpubot.scheduler import IntervalScheduler
from gpubot.slack.api import SlackApi
from gpubot.slack.app import GpuBot
from gpubot.store import Store, VerifyResult

log = logging.getLogger(__name__)


def render_head(result: VerifyResult, at: datetime) -> Message:
    """Render a publication: the verified head and how to check against it, or the failure."""
    when = date(at.timestamp())
    if not result.ok:
        line = escape(result.line())
        return {
            "text": f"⚠ The audit log does not verify: {line}",
            "blocks": [
                header("⚠ Audit log check failed"),
                section(f"*{line}*\nNo head is published until this is explained."),
                context(f"gpubot audit head · {when}"),
            ],
        }
    if result.head_seq == 0:
        text = "The audit log holds no record yet: no head to publish."
        return {"text": text, "blocks": [section(text), context(f"gpubot audit head · {when}")]}
    head = result.head
    return {
        "text": f"Audit log head {head}",
        "blocks": [
            header("Audit log head"),
            section(
                f"`{head}`\n{result.checked} records, {escape(result.mode_text())}.\n"
                "This message is a copy of the head outside the database: keep it."
            ),
            context(f"Check the log still holds it: `gpubot audit verify --expect-head {head}`"),
            context(f"gpubot audit head · {when}"),
        ],
    }


class HeadPublisher:
    """Walks the chain and posts its head to one channel (what the schedule runs)."""

    def __init__(self, store: Store, api: SlackApi, channel: str) -> None:
        self.store = store
        self.api = api
        self.channel = channel
        self.last: tuple[int, str] | None = None  # the head this publisher posted last

    async def publish(self) -> VerifyResult | None:
        """Verify the log (it must still hold the last head posted) and post the verdict."""
        try:
            result = await self.store.verify(published=self.last)
        except GpubotError as exc:
            log.error("audit head not published: %s", exc)
            return None
        if result.ok and result.head_seq > 0:
            self.last = (result.head_seq, result.head_hash)
            log.info("audit head %s posted to %s", result.head, self.channel)
        elif not result.ok:
            log.error("%s", result.line())
        await self.api.post(self.channel, render_head(result, datetime.now(UTC)))
        return result


@dataclass
class HeadPublication:
    """The running publication; ``stop()`` stops it."""

    publisher: HeadPublisher
    scheduler: IntervalScheduler

    async def stop(self) -> None:
        """Stop the schedule (a publication under way may finish)."""
        await self.scheduler.stop()


async def start_head_publication(
    settings: Settings, app: App, bot: GpuBot, *, first_after_s: float | None = None
) -> HeadPublication | None:
    """Post the audit head to the alerts channel every ``[audit] publish_head_every``.

    Returns None (and says why in the log) when it is off, or there is no store or channel.
    """
    every = settings.audit.publish_head_every_s
    if every is None or app.store is None:
        return None
    channel = load_sweep_config(settings.extra, settings.path or "<settings>").channel
    channel = channel or bot.services.policy.channel
    if channel is None:
        log.warning("no [alerts] or [slack] channel: the audit head is not published")
        return None
    publisher = HeadPublisher(app.store, bot.api, channel)
    scheduler = IntervalScheduler(publisher.publish, every, first_after_s=first_after_s,
                                  name="audit-head")  # fmt: skip
    scheduler.start()
    return HeadPublication(publisher, scheduler)
