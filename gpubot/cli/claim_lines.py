"""Claims under ``gpubot status``: light, so the cold status path stays fast."""

from __future__ import annotations

from gpubot.app import App
from gpubot.core.claims.rules import Claim
from gpubot.core.timefmt import iso
from gpubot.errors import StoreError


async def claims_on(app: App, nodes: list[str]) -> list[Claim] | None:
    """Return the active claims of ``nodes`` (None: off or unavailable; the status stands)."""
    if not app.settings.claims.enabled or app.store is None:
        return None
    try:
        return [c for c in await app.store.claims.active() if c.node in nodes]
    except StoreError:
        return None


def claim_text(c: Claim) -> str:
    """Return "claimed by alice until 14:00Z · note" (UTC)."""
    note = f" · {c.note}" if c.note else ""
    return f"claimed by {c.user} until {iso(c.end)[11:16]}Z{note}"
