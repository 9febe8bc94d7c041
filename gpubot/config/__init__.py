"""Settings: one frozen object, loaded once from TOML (+ environment for secrets), passed down.

Every problem is a ``ConfigError`` whose message names the file, the key and what is wrong.
``settings`` holds the typed object, ``validate`` the one validator and the general sections,
``tables`` the policy, sweep, metrics and cli tables, ``front_ends`` the forms of the chat ids.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpubot.config import claims, front_ends, nodes, sharing, tables, validate
from gpubot.config.settings import (
    AttributionSettings,
    AuditSettings,
    LeaseSettings,
    MetricsSettings,
    ResetSettings,
    Settings,
    SshSettings,
)
from gpubot.config.validate import Validator, check_port
from gpubot.core.slurm import SLURM
from gpubot.core.telemetry import PROMETHEUS
from gpubot.errors import ConfigError

__all__ = [
    "AttributionSettings",
    "AuditSettings",
    "LeaseSettings",
    "MetricsSettings",
    "ResetSettings",
    "Settings",
    "SshSettings",
    "audit_key",
    "check_port",
    "config_path",
    "expand",
    "load",
    "parse",
]

AUDIT_KEY_ENV = "GPUBOT_AUDIT_KEY"  # makes the audit chain an HMAC chain (see store.chain)
MIN_AUDIT_KEY = 16
SECTIONS = {
    "database",
    "ssh",
    "reset",
    "nodes",
    "audit",
    "groups",
    "attribution",
    "users",
    "approvals",
    "permissions",
    "sweep",
    "alerts",
    "metrics",
    "leases",
    "cli",
    "teams",
    "reports",
    "idle",
    "claims",
    "maint",
    SLURM,
    PROMETHEUS,
}


def config_path(cli_value: str | None, environ: Mapping[str, str]) -> Path:
    """Choose the settings file: ``--config``, else ``$GPUBOT_CONFIG``, else ``./gpubot.toml``."""
    return Path(cli_value or environ.get("GPUBOT_CONFIG") or "gpubot.toml")


def load(path: Path) -> Settings:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file (use --config or $GPUBOT_CONFIG)") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse(raw, str(path))


def parse(raw: Mapping[str, Any], where: str = "<settings>") -> Settings:
    v = Validator(where)
    v.keys("", raw, SECTIONS | set(front_ends.KNOWN))  # each front end's own section
    url = validate.database(v, raw)
    ssh = validate.ssh(v, raw)
    reset = validate.reset(v, raw)
    return Settings(
        path=where,
        database_url=url,
        ssh=ssh,
        reset=reset,
        nodes=nodes.nodes(v, raw),
        audit=validate.audit(v, raw),
        attribution=validate.attribution(v, raw),
        policy=tables.policy(v, raw, reset.system_users),
        sweep=tables.sweep(v, raw),
        metrics=tables.metrics(v, raw),
        leases=validate.leases(v, raw),
        cli=tables.cli(v, raw),
        reports=sharing.reports(v, raw),
        ladder=sharing.ladder(v, raw),
        claims=claims.claims(v, raw),
        maint=claims.maint(v, raw),
        slurm=nodes.slurm(v, raw),
        prometheus=nodes.prometheus(v, raw),
    )


def audit_key(environ: Mapping[str, str]) -> bytes | None:
    """Return the audit chain's HMAC key from ``$GPUBOT_AUDIT_KEY``; None when it is not set.

    Surrounding whitespace is dropped (a key read with ``$(cat file)`` or from an env file is
    the same key). A key that is set but short or empty is an error: never a silent plain chain.
    """
    raw = environ.get(AUDIT_KEY_ENV)
    if raw is None:
        return None
    key = raw.strip().encode("utf-8")
    if len(key) < MIN_AUDIT_KEY:
        raise ConfigError(
            f"{AUDIT_KEY_ENV} is set but shorter than {MIN_AUDIT_KEY} characters: use a long "
            "random secret (e.g. `openssl rand -hex 32`), or unset it"
        )
    return key


def expand(path: str) -> str:
    return os.path.expanduser(path)
