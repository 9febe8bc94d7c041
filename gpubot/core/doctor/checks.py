"""``gpubot doctor``'s checklist: a ``Check`` per thing that must be right, with its fix.

Pure decisions over facts gathered elsewhere, so every verdict and fix line is tested with
tables of cases. A failed check always carries the one line that fixes it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpubot.core.text import one_line

OK_MARK = "✓"
FAIL_MARK = "✗"
MIN_BASH = (4, 4)  # the probe's: the first bash that waits for a process substitution
_BASH = re.compile(r"GNU bash, version (\d+)\.(\d+)")


@dataclass(frozen=True)
class Check:
    """One line of the checklist; a failed one carries the line that fixes it."""

    area: str
    name: str
    ok: bool
    detail: str = ""
    fix: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "area": self.area,
            "check": self.name,
            "ok": self.ok,
            "detail": self.detail,
            "fix": None if self.ok else self.fix,
        }


def passed(area: str, name: str, detail: str = "") -> Check:
    return Check(area, name, True, detail)


def failed(area: str, name: str, detail: str, fix: str) -> Check:
    """Return a failed check; ``fix`` is the one line that puts it right."""
    return Check(area, name, False, detail, fix)


def verdict(area: str, name: str, problem: str | None, fix: str, detail: str = "") -> Check:
    """Return the check that failed with ``problem`` (its fix), or passed when there is none."""
    return passed(area, name, detail) if problem is None else failed(area, name, problem, fix)


def unknown_key(where: str, key: str, known: Iterable[str]) -> Check:
    """Return the failed check of an unknown settings key, with "did you mean" when close."""
    leaf = key.rsplit(".", 1)[-1]
    guess = difflib.get_close_matches(leaf, sorted(known), n=1, cutoff=0.6)  # a typo's meaning
    if guess:
        fix = f"did you mean {key[: -len(leaf)]}{guess[0]}? rename it in {where}"
    else:
        names = ", ".join(sorted(known)) or "none"
        fix = f"remove it from {where} (known here: {names})"
    return failed("config", f"key {key}", "unknown key", fix)


def bash_check(area: str, text: str | None) -> Check:
    """Check the node's bash (``text``: ``bash --version``'s first line; None: no bash)."""
    name = "bash >= 4.4"
    if text is None:
        return failed(area, name, "no bash on the node", "install bash 4.4 or later")
    m = _BASH.search(text)
    if m is None:
        return failed(
            area, name, f"not GNU bash: {one_line(text)[:80]!r}", "install bash 4.4 or later"
        )
    shown = f"bash {m[1]}.{m[2]}"
    if (int(m[1]), int(m[2])) < MIN_BASH:
        return failed(
            area,
            name,
            f"{shown} is older than 4.4: the probe stops with 'old-bash'",
            "upgrade bash to 4.4 or later (RHEL 8, Ubuntu 18.04, Debian 10 have it)",
        )
    return passed(area, name, shown)


def readable_check(area: str, what: str, path: str, problem: str | None) -> Check:
    """Check that a file the settings name can be read (``problem``: why not, or None)."""
    why = None if problem is None else f"{path}: {problem}"
    return verdict(area, f"{what} readable", why, f"make {path} readable by gpubot", path)


def all_ok(checks: Sequence[Check]) -> bool:
    """Whether every check holds (``gpubot doctor`` exits 0 only then)."""
    return all(c.ok for c in checks)


def render(checks: Sequence[Check]) -> str:
    """Return the checklist as text: one line per check, its fix on the next line."""
    lines: list[str] = []
    area = None
    for c in checks:
        if c.area != area:
            area = c.area
            lines.append(f"{area}:")
        detail = f": {c.detail}" if c.detail else ""
        lines.append(one_line(f"  {OK_MARK if c.ok else FAIL_MARK} {c.name}{detail}"))
        if not c.ok:
            lines.append(one_line(f"      fix: {c.fix}"))
    bad = sum(1 for c in checks if not c.ok)
    lines.append(f"{len(checks) - bad} passed, {bad} failed")
    return "\n".join(lines)


def as_document(checks: Sequence[Check]) -> dict[str, Any]:
    return {"ok": all_ok(checks), "checks": [c.as_dict() for c in checks]}
