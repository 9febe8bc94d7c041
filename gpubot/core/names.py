"""The name rules and the privilege prefix, each defined once for every layer.

``LINUX_USER`` is shadow-utils' rule for a new user name (``useradd``, ``libmisc/chkname.c``:
``[a-z_][a-z0-9_.-]*[$]?``, 32 characters, the utmp limit, and the ``$``), inside POSIX's portable
user name (the portable filename set, ``A-Za-z0-9._-``, not starting with ``-``). It allows
``.``: directory-backed accounts are often ``first.last`` (SSSD, winbind), and such users exist
on the nodes gpubot acts on; a rule without ``.`` refused them in the settings file and the
``user`` option while the parser of a node's answer accepted them. It allows a last ``$``
(Samba's machine accounts, which shadow-utils accepts as an extension). It is stricter than
POSIX where gpubot gains by it: lowercase only, and never a leading digit, so a name is never
taken for a uid.

``NODE_NAME`` is a node's or group's name in the settings file and in commands: a DNS label's
characters plus ``.`` and ``_``, at most 63.

``SUDO`` is the prefix of a privileged command on a ``sudo = true`` node: ``-n`` so that sudo
fails at once instead of asking for a password that nobody will type.
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
