"""Prototypes of fixes to gpubot's own code, applied by monkeypatching, to measure their effect.

gpubot's code is not changed here: a fix that proves itself is described in the README for the
maintainers to apply. ``apply(name)`` patches the running process;
``python -m benchmarks.experiments NAME -- GPUBOT-ARGS...`` runs the gpubot CLI patched
(``benchmarks.run --experiments NAME`` runs the Slack burst so too).

The ``coalesce`` prototype (single flight for fleet status) is gone: gpubot does it itself now
(``StatusService.fleet``). What is left is a diagnostic, not a fix:

- ``smi-only``: the probe cut to the two nvidia-smi queries (no ``fuser``; ``/proc`` only for the
  PIDs nvidia-smi lists, which the strict parser insists on), so gpubot's warm path does about the
  floor's remote work: what is left of the gap is gpubot's own client-side cost (transport,
  parsing, rendering, audit).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

NAMES = ("smi-only",)
Undo = Callable[[], None]


def _smi_only() -> Undo:
    from gpubot.core.probe import snapshot as probe

    original = probe.PROBE_SCRIPT
    start = original.index("\n# Each GPU's device minor")
    end = original.index("\nprocs $extra $FP\n")
    # An empty fuser section (exit 1: no device file given); /proc read for nvidia-smi's PIDs only
    # (the parser insists on every PID it was told of).
    probe.PROBE_SCRIPT = (
        original[:start]
        + "\nm minors\nm fuser 1\nm view - -\nprocs $extra"
        + original[end + len("\nprocs $extra $FP") :]
    )

    def undo() -> None:
        probe.PROBE_SCRIPT = original

    return undo


_EXPERIMENTS: dict[str, Callable[[], Undo]] = {"smi-only": _smi_only}


def apply(name: str) -> Undo:
    """Patch this process with experiment ``name``; return what undoes it."""
    if name not in _EXPERIMENTS:
        raise SystemExit(f"unknown experiment {name!r} (known: {', '.join(NAMES)})")
    return _EXPERIMENTS[name]()


@contextlib.contextmanager
def patched(name: str) -> Iterator[None]:
    """Apply experiment ``name`` (nothing for '') while the block runs."""
    undo = apply(name) if name else None
    try:
        yield
    finally:
        if undo is not None:
            undo()


def main(argv: list[str]) -> int:
    """Run ``gpubot`` with an experiment applied: ``NAME -- ARGS...``."""
    name, rest = argv[0], argv[1:]
    if rest[:1] == ["--"]:
        rest = rest[1:]
    apply(name)
    from gpubot.cli import main as gpubot_main

    result: Any = gpubot_main(rest)
    return int(result)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
