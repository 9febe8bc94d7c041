"""Issue 26's parts of the composition root: GPU-hours, the reclaim ladder and its Slack side.

``gpubot.app`` calls ``sharing_ports`` while it wires the sweep; what sharing a box adds is
built here, so the root stays one screen per concern.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpubot.config import Settings
from gpubot.services.digest import DigestService
from gpubot.services.directory import Directory
from gpubot.services.ladder import LadderNotifier, ReclaimLadder
from gpubot.services.usage import ClaimedIntervals, UsageService

if TYPE_CHECKING:
    from gpubot.slack.api import SlackApi
    from gpubot.store import Store


def sharing_ports(
    settings: Settings,
    store: Store,
    slack: SlackApi | None,
    directory: Directory | None,
    claims: ClaimedIntervals | None = None,
) -> tuple[UsageService, ReclaimLadder, DigestService | None]:
    """Return the GPU-hours service, the reclaim ladder over ``store`` (told in Slack when
    ``slack`` is given) and the weekly digest (with Slack, a channel and ``[reports] digest``).
    ``claims``: the claims' store, once it is wired; without it no GPU counts as claimed."""
    usage = UsageService(settings, store.usage, claims=claims, directory=directory)
    notifier: LadderNotifier | None = None
    if slack is not None:
        from gpubot.slack.alerts import slack_users_of
        from gpubot.slack.ladder import SlackLadder

        people = slack_users_of(settings.policy.users)
        notifier = SlackLadder(slack, settings.sweep.channel, people, store.alerts)
    ladder = ReclaimLadder(settings.ladder, store.ladder, store.samples, notifier)
    cfg = settings.reports
    channel = cfg.digest_channel or settings.sweep.channel
    digest = None
    if cfg.digest is not None and slack is not None and channel is not None:
        from gpubot.slack.digest import SlackDigest

        poster = SlackDigest(slack, channel)
        digest = DigestService(cfg.digest, cfg.digest_by, usage, store.digests, poster)
    return usage, ladder, digest
