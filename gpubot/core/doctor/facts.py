"""``gpubot doctor``'s database checks: facts in, ``Check`` lines out (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from gpubot.core.doctor.checks import Check, failed, passed, verdict


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
        fix = "fix [database] url (and $GPUBOT_DB_PASSWORD), then `gpubot db upgrade`"
        return [failed(area, "opens", f"{facts.url}: {facts.error}", fix)]
    if facts.missing is not None:  # the doctor reports it: creating it is not a check
        why = f"{facts.missing}: no such file (gpubot creates it on first use)"
        fix = "run `gpubot db upgrade` to create it now, or point [database] url at the database"
        return [failed(area, "exists", why, fix)]
    behind = None
    if facts.revision != facts.head:
        behind = f"at {facts.revision or 'base (empty)'}, this gpubot needs {facts.head}"
    write_fix = "give gpubot's account write access to the database (file and folder)"
    checks = [
        passed(area, "opens", facts.url),
        verdict(area, "migrated", behind, "run `gpubot db upgrade`", f"at {facts.head}"),
        verdict(area, "writable", facts.write_error, write_fix),
    ]
    if facts.file is not None and facts.file_mode is not None:
        # A SQLite file must be private: it holds every person's command lines.
        mode = f"{facts.file_mode:04o}"
        shared = f"{facts.file} has mode {mode}: other users can read it"
        shared_or_not = shared if facts.file_mode & 0o077 else None
        fix = f"chmod 600 {facts.file}"
        checks.append(verdict(area, "file private", shared_or_not, fix, f"mode {mode}"))
    keyed = "keyed log, key matches" if facts.keyed else "plain log (no key needed)"
    fix = "set GPUBOT_AUDIT_KEY to the key the log was keyed with"
    checks.append(verdict(area, "audit key", facts.keyed_error, fix, keyed))
    return checks
