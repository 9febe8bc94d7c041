"""Claims' wiring for the composition root (issue 26): the claims service over the store,
its gauge, the sweep's intruder findings and the chat services' claims."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpubot.chat.flows import Services
    from gpubot.config import Settings
    from gpubot.metrics import Metrics
    from gpubot.services.status import StatusService
    from gpubot.services.sweep import SweepService
    from gpubot.store import Store


def wire_claims(
    settings: Settings,
    store: Store | None,
    status: StatusService,
    metrics: Metrics | None,
    sweep: SweepService,
    chat: Services,
) -> None:
    """With a store: build the claims service and hand it to the sweep and the chat."""
    if store is None:
        return
    from gpubot.services.claims import ClaimService

    claims = ClaimService(settings, store.claims, status)
    if metrics is not None:
        claims.observe = metrics.observe_claims  # gpubot_gpu_claimed
    sweep.extra = claims.intruder_findings  # unclaimed use of claimed GPUs
    chat.claims = claims
