"""The simulator's own errors: none is gpubot's, and gpubot never catches them but at its demo.

::

    SimError                         the simulated fleet failed (server, workload, daemon)
    └── SimUsageError(ValueError)    it was asked what it cannot do (an option, a request)

Every message is one line fit to show a person: ``python -m gpusim`` prints it as such, and
``gpubot demo`` / ``gpubot sim`` (``gpubot/cli/demo.py``) turn it into gpubot's one-line error.
"""

from __future__ import annotations


class SimError(Exception):
    """Base of every error the simulator raises on purpose; raised itself, the simulated fleet
    failed: a server, a workload or the fleet daemon did not start."""


class SimUsageError(SimError, ValueError):
    """The simulator was given input that cannot be acted on (a bad option or request)."""
