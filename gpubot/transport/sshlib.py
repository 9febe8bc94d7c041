"""asyncssh, imported the one way gpubot (and the simulator) import it.

cryptography 51 deprecated DSA, and asyncssh names the DSA classes on import: every command would
print that warning and a JSON log stream would get lines that are not JSON. gpubot never uses DSA
keys, so it is ignored here, narrowly: that category and message, from asyncssh's modules only.
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

import asyncssh as asyncssh  # noqa: E402  (after its filter, on purpose)
