"""asyncssh, imported the one way gpubot (and the simulator) import it.

cryptography 51 deprecated DSA, and asyncssh names the DSA classes while it is imported: every
``gpubot`` command would print that deprecation before its output, and a JSON log stream would
get lines that are not JSON. gpubot never offers or accepts DSA keys, so the warning means nothing
to an operator. It is ignored here, narrowly: that category, that message, raised from asyncssh's
own modules only. Any other warning, from asyncssh or anywhere else, still reaches the filters the
process has (``-W error`` in the tests).
"""

from __future__ import annotations

import warnings

from cryptography.utils import CryptographyDeprecationWarning

warnings.filterwarnings(
    "ignore",
    message=r"DSA is deprecated",
    category=CryptographyDeprecationWarning,
    module=r"asyncssh(\.|$)",
)

import asyncssh  # noqa: E402  (after its filter, on purpose)

__all__ = ["asyncssh"]
