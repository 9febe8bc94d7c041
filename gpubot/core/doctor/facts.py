"""``gpubot doctor``'s database checks: facts in, ``Check`` lines out (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from gpubot.core.doctor.checks import Check, failed, passed


@dataclass(frozen=True)
class DbFacts:
    """What the database said; ``error``: it could not be opened at all."""

    url: str
    error: str | None = None
    missing: str | None = None  # a SQLite file that does not exist (the doctor creates none)
    revision: str | None = None  # None: empty (no migration applied)
    head: str = ""
    write_error: str | None = None  # None: a write (rolled back) went through
    keyed_error: str | None = None  # the keyed log refuses this key (or its absence)
    keyed: bool = False
    file: str | None = None  # a SQLite database's file
    file_mode: int | None = None  # its permission bits


def db_checks(facts: DbFacts) -> list[Check]:
    """Check that the database opens, is migrated, takes writes, and has its audit key."""
    area = "database"
    if facts.error is not None:
        return [
            failed(
                area,
                "opens",
                f"{facts.url}: {facts.error}",
                "fix [database] url (and $GPUBOT_DB_PASSWORD), then `gpubot db upgrade`",
            )
        ]
    if facts.missing is not None:
        return [_missing(facts.missing)]
    checks = [passed(area, "opens", facts.url)]
    if facts.revision != facts.head:
        checks.append(
            failed(
                area,
                "migrated",
                f"at {facts.revision or 'base (empty)'}, this gpubot needs {facts.head}",
                "run `gpubot db upgrade`",
            )
        )
    else:
        checks.append(passed(area, "migrated", f"at {facts.head}"))
    if facts.write_error is not None:
        checks.append(
            failed(
                area,
                "writable",
                facts.write_error,
                "give gpubot's account write access to the database (file and folder)",
            )
        )
    else:
        checks.append(passed(area, "writable"))
    if facts.file is not None and facts.file_mode is not None:
        checks.append(_file_mode(facts.file, facts.file_mode))
    if facts.keyed_error is not None:
        checks.append(
            failed(
                area,
                "audit key",
                facts.keyed_error,
                "set GPUBOT_AUDIT_KEY to the key the log was keyed with",
            )
        )
    else:
        checks.append(
            passed(
                area,
                "audit key",
                "keyed log, key matches" if facts.keyed else "plain log (no key needed)",
            )
        )
    return checks


def _missing(path: str) -> Check:
    """Say that a SQLite file is not there: the doctor reports it, creating it is not a check."""
    return failed(
        "database",
        "exists",
        f"{path}: no such file (gpubot creates it on first use)",
        "run `gpubot db upgrade` to create it now, or point [database] url at the database",
    )


def _file_mode(path: str, mode: int) -> Check:
    """Check that a SQLite file is private: it holds every person's command lines."""
    if mode & 0o077:
        return failed(
            "database",
            "file private",
            f"{path} has mode {mode:04o}: other users can read it",
            f"chmod 600 {path}",
        )
    return passed("database", "file private", f"mode {mode:04o}")
