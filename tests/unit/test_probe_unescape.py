"""The probe's escaped fields decode exactly (issue 24 made the usual case faster: argv's NUL
separators are replaced at once, the other escapes as before). Any bytes a hostile process can
put in its argv, name or cgroup come back as they were, whatever escapes sit next to each other
(an escaped backslash before ``000`` is a backslash and three digits, never a NUL)."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from gpubot.core.probe.fields import _unescape

_OCTAL = re.compile(r"\\([0-3][0-7]{2})")


def escaped(raw: bytes) -> str:
    """Escape as the probe does: printable ASCII but the backslash as is, the rest ``\\ooo``."""
    return "=" + "".join(chr(b) if 0x21 <= b <= 0x7E and b != 0x5C else f"\\{b:03o}" for b in raw)


def before(field: str) -> str:
    """``_unescape`` as it was: every escape through the regex."""
    raw = _OCTAL.sub(lambda m: chr(int(m[1], 8)), field[1:])
    return raw.encode("latin-1").decode("utf-8", errors="replace")


def test_an_escaped_backslash_before_zeros_is_no_nul() -> None:
    field = escaped(b"a\\000b\x00c")
    assert field == "=a\\134000b\\000c"
    assert _unescape(field, "test") == "a\\000b\0c"


@given(st.binary(max_size=64))
def test_any_bytes_come_back_as_they_were(raw: bytes) -> None:
    field = escaped(raw)
    assert _unescape(field, "test") == raw.decode("utf-8", errors="replace") == before(field)
