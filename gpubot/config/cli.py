"""The ``[cli]`` settings: how the terminal commands lay out what they print."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpubot.config.settings import CliSettings
from gpubot.config.validate import Validator


def cli(v: Validator, raw: Mapping[str, Any]) -> CliSettings:
    """Validate ``[cli]``."""
    t = v.table("cli", raw.get("cli", {}))
    v.keys("cli", t, {"summary_above"})
    above = int(v.positive("cli.summary_above", t.get("summary_above", 8), integer=True, zero=True))
    return CliSettings(above)
