"""``gpubot doctor``'s settings checks: every key known, every file the settings name readable.

The loader stops at the first problem; the doctor lists every unknown key (each with a "did you
mean" for a near miss), by validating again without each one it found, then the first other
problem, if any.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpubot.config import AUDIT_KEY_ENV, Settings, audit_key, expand, parse
from gpubot.config.validate import UnknownKey
from gpubot.core.doctor.checks import Check, failed, passed, readable_check, unknown_key
from gpubot.errors import ConfigError

MAX_UNKNOWN = 50  # keys listed before the doctor gives up on a file


def config_checks(path: Path, environ: Mapping[str, str]) -> tuple[list[Check], Settings | None]:
    """Return the settings file's checks and its settings (None when it cannot be used)."""
    where = str(path)
    try:
        raw: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        fix = "write one from gpubot.example.toml, or point --config / $GPUBOT_CONFIG at it"
        return [failed("config", "settings file", f"{where}: no such file", fix)], None
    except OSError as exc:
        return [readable_check("config", "settings file", where, exc.strerror)], None
    except tomllib.TOMLDecodeError as exc:
        return [failed("config", "settings file", f"not valid TOML: {exc}", f"fix {where}")], None
    checks = [passed("config", "settings file", where)]
    settings = None
    for _ in range(MAX_UNKNOWN):
        try:
            settings = parse(raw, where)
            break
        except UnknownKey as exc:
            checks.append(unknown_key(where, exc.path, exc.allowed))
            if not isinstance(exc.table, dict):
                break
            del exc.table[exc.key]  # the table in ``raw`` itself: validate again without it
        except ConfigError as exc:
            checks.append(failed("config", "settings valid", str(exc), f"correct it in {where}"))
            break
    if settings is None:
        return checks, None
    if all(c.ok for c in checks):  # else the unknown keys above are what is not valid
        checks.append(passed("config", "settings valid"))
    checks += file_checks(settings)
    checks.append(_audit_key(environ))
    return checks, settings


def file_checks(settings: Settings) -> list[Check]:
    """Check every file the settings name: known_hosts, each node's key, the head file's folder."""
    checks = [readable_check("config", "ssh.known_hosts", *_readable(settings.ssh.known_hosts))]
    keys: dict[str, str] = {}
    for n in settings.nodes:
        if n.key is not None:
            keys.setdefault(n.key, n.name)
    for key, node in keys.items():
        checks.append(readable_check("config", f"key of {node}", *_readable(key)))
    head = settings.audit.head_file
    if head is not None:
        folder = os.path.dirname(head) or "."
        if os.access(folder, os.W_OK | os.X_OK):
            checks.append(passed("config", "audit.head_file writable", head))
        else:
            checks.append(
                failed(
                    "config",
                    "audit.head_file writable",
                    f"cannot write in {folder}",
                    f"create {folder} writable by gpubot's account",
                )
            )
    return checks


def _readable(path: str) -> tuple[str, str | None]:
    """Return (the expanded path, why it cannot be read or None)."""
    full = expand(path)
    try:
        with open(full, "rb") as f:
            f.read(1)
    except OSError as exc:
        return full, exc.strerror or str(exc)
    return full, None


def _audit_key(environ: Mapping[str, str]) -> Check:
    try:
        key = audit_key(environ)
    except ConfigError as exc:
        return failed("config", AUDIT_KEY_ENV, str(exc), "set a key of 16 or more characters")
    return passed("config", AUDIT_KEY_ENV, "set" if key is not None else "not set (a plain log)")
