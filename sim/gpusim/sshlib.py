"""asyncssh as the simulator imports it: with cryptography 51's DSA deprecation ignored.

The same narrow filter as ``gpubot/transport/sshlib.py`` (that category and message, from
asyncssh's own modules only), kept here because the simulator imports nothing of gpubot. The
simulated fleet serves no DSA key; the warning would only print before the demo's output.
"""

from __future__ import annotations

import warnings

from cryptography.utils import CryptographyDeprecationWarning

warnings.filterwarnings(
    "ignore", "DSA is deprecated", CryptographyDeprecationWarning, r"asyncssh(\.|$)"
)

import asyncssh  # noqa: E402  (after its filter, on purpose)

__all__ = ["asyncssh"]
