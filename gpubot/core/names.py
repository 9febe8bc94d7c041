"""The name rules and the privilege prefix, each defined once for every layer.

``LINUX_USER`` is shadow-utils' rule for a new user name (``libmisc/chkname.c``, 32 characters).
It allows ``.`` (directory-backed accounts are often ``first.last``) and a last ``$`` (Samba's
machine accounts); it is stricter than POSIX in being lowercase and never starting with a digit,
so a name is never taken for a uid.

``NODE_NAME``: a DNS label's characters plus ``.`` and ``_``, at most 63.

``SUDO`` uses ``-n`` so that sudo fails at once instead of asking for a password nobody types.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

LINUX_USER = re.compile(r"[a-z_][a-z0-9_.-]{0,31}\$?")
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
SUDO: tuple[str, ...] = ("sudo", "-n")
SUDO_SH = " ".join(SUDO)  # the same prefix inside gpubot's shell scripts


def is_linux_user(name: str | None) -> bool:
    """Whether ``name`` is a well-formed Linux user name (``LINUX_USER``)."""
    return name is not None and LINUX_USER.fullmatch(name) is not None


def as_root(argv: Sequence[str], *, sudo: bool) -> list[str]:
    """Return ``argv`` prefixed with ``sudo -n`` when the node runs privileged commands so."""
    return [*SUDO, *argv] if sudo else list(argv)
