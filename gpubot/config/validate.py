"""The one validator of settings tables, and the general sections: ``[database]``, ``[ssh]``,
``[reset]``, ``[attribution]``, ``[leases]``, ``[audit]`` (``[[nodes]]`` and ``[groups]``:
``config.nodes``).

Every problem is a ``ConfigError`` whose message is one line: the file, the key, what is wrong.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from gpubot.config import front_ends
from gpubot.config.settings import (
    AttributionSettings,
    AuditSettings,
    LeaseSettings,
    ResetSettings,
    SshSettings,
)
from gpubot.core import durations
from gpubot.errors import ConfigError

LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")
MIN_PUBLISH_S = 60.0  # an [audit] interval under a minute is noise, likely a typo


class UnknownKey(ConfigError):
    """A key the settings do not know (``gpubot doctor`` lists them all, with their fix);
    ``table`` is the table of the file's decoded document that holds it."""

    def __init__(
        self, where: str, section: str, key: str, allowed: set[str], table: Mapping[str, Any]
    ) -> None:
        self.table = table
        self.key = key
        self.allowed = frozenset(allowed)
        self.path = f"{section}.{key}" if section else key
        super().__init__(f"{where}: {self.path}: unknown key")


class Validator:
    """Checks values of one settings file; every refusal names the file and the key."""

    def __init__(self, where: str) -> None:
        self.where = where

    def keys(self, section: str, table: Mapping[str, Any], allowed: set[str]) -> None:
        for k in table:
            if k not in allowed:
                raise UnknownKey(self.where, section, k, allowed, table)

    def table(self, key: str, value: Any) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{self.where}: {key}: expected a table")
        return value

    def string(self, key: str, value: Any) -> str:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{self.where}: {key}: expected a non-empty string")
        return value

    def boolean(self, key: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{self.where}: {key}: expected true or false")
        return value

    def strings(self, key: str, value: Any) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(x, str) and x for x in value):
            raise ConfigError(f"{self.where}: {key}: expected a list of non-empty strings")
        return tuple(value)

    def positive(self, key: str, value: Any, *, integer: bool = False, zero: bool = False) -> float:
        ok_type = isinstance(value, int) if integer else isinstance(value, int | float)
        if isinstance(value, bool) or not ok_type or value < 0 or (value == 0 and not zero):
            kind = "a whole number" if integer else "a number"
            bound = ">= 0" if zero else "> 0"
            raise ConfigError(f"{self.where}: {key}: expected {kind} {bound}, got {value!r}")
        return float(value)

    def seconds(self, key: str, value: Any, most: float, *, zero: bool = False) -> float:
        ok = not isinstance(value, bool) and isinstance(value, int | float)
        if not ok or not (value >= 0 if zero else value > 0) or value > most:
            span = f"from 0 to {most:g}" if zero else f"> 0 and <= {most:g}"
            raise ConfigError(f"{self.where}: {key}: expected seconds {span}, got {value!r}")
        return float(value)

    def channel(self, key: str, value: Any) -> str | None:
        """Return a channel id of the primary front end, or None when not set."""
        if value is None:
            return None
        ids = front_ends.forms(self.where, key)
        if not isinstance(value, str) or not ids.place.fullmatch(value):
            raise ConfigError(f"{self.where}: {key}: expected {ids.place_words}, got {value!r}")
        return value

    def section(self, name: str, value: Any, allowed: set[str]) -> Table:
        """Return the table ``value`` at ``name``, once its keys are all ``allowed``."""
        table = self.table(name, value)
        self.keys(name, table, allowed)
        return Table(self, name, table)


@dataclass(frozen=True)
class Table:
    """One settings table: each value read with its default and checked under its full key."""

    v: Validator
    name: str
    t: Mapping[str, Any]

    def positive(self, key: str, default: Any, **kw: bool) -> float:
        return self.v.positive(f"{self.name}.{key}", self.t.get(key, default), **kw)

    def seconds(self, key: str, default: Any, most: float, **kw: bool) -> float:
        return self.v.seconds(f"{self.name}.{key}", self.t.get(key, default), most, **kw)

    def boolean(self, key: str, default: bool) -> bool:
        return self.v.boolean(f"{self.name}.{key}", self.t.get(key, default))

    def string(self, key: str, default: str) -> str:
        return self.v.string(f"{self.name}.{key}", self.t.get(key, default))

    def strings(self, key: str, default: Any) -> tuple[str, ...]:
        return self.v.strings(f"{self.name}.{key}", self.t.get(key, default))


def names(settings: type) -> set[str]:
    """Return the field names of a settings dataclass: its table's keys."""
    return {f.name for f in fields(settings)}


def check_port(value: Any, what: str) -> int:
    """Return ``value`` as a TCP port number or raise ``ConfigError`` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise ConfigError(f"{what}: {value!r} is not a port number (0-65535, 0: any free port)")
    return value


def database(v: Validator, raw: Mapping[str, Any]) -> str:
    """Return ``[database] url`` (never with a password in it)."""
    url = v.section("database", raw.get("database", {}), {"url"}).string(
        "url", "sqlite:///gpubot.db"
    )
    if "@" in url and ":" in url.split("@", 1)[0].split("//", 1)[-1]:
        raise ConfigError(
            f"{v.where}: database.url: put the password in $GPUBOT_DB_PASSWORD, not here"
        )
    return url


def ssh(v: Validator, raw: Mapping[str, Any]) -> SshSettings:
    t = v.section("ssh", raw.get("ssh", {}), names(SshSettings))
    d = SshSettings()
    return SshSettings(
        known_hosts=t.string("known_hosts", d.known_hosts),
        connect_timeout_s=t.positive("connect_timeout_s", d.connect_timeout_s),
        command_timeout_s=t.positive("command_timeout_s", d.command_timeout_s),
        max_parallel=int(t.positive("max_parallel", d.max_parallel, integer=True)),
        keepalive_s=t.positive("keepalive_s", d.keepalive_s),
    )


def reset(v: Validator, raw: Mapping[str, Any]) -> ResetSettings:
    """Validate ``[reset]`` (protected daemons by absolute path only)."""
    t = v.section("reset", raw.get("reset", {}), names(ResetSettings))
    d = ResetSettings()
    toggle = t.boolean("toggle_persistence", False)
    protected = t.strings("protected", list(d.protected))
    for p in protected:
        if not p.startswith("/"):
            raise ConfigError(
                f"{v.where}: reset.protected: {p!r} is not an absolute path: list daemon "
                "executables by path (e.g. /usr/bin/nvidia-persistenced), never by name"
            )
    system_users = t.strings("system_users", list(d.system_users))
    return ResetSettings(
        grace_s=t.positive("grace_s", d.grace_s, zero=True),
        verify_timeout_s=t.positive("verify_timeout_s", d.verify_timeout_s),
        free_threshold_mib=int(
            t.positive("free_threshold_mib", d.free_threshold_mib, integer=True, zero=True)
        ),
        poll_interval_s=t.positive("poll_interval_s", d.poll_interval_s),
        protected=protected,
        system_users=system_users,
        toggle_persistence=toggle,
        stop_workloads=t.boolean("stop_workloads", False),
        respawn_watch_s=t.positive("respawn_watch_s", d.respawn_watch_s, zero=True),
        diag_quick_s=t.positive("diag_quick_s", d.diag_quick_s),
        diag_medium_s=t.positive("diag_medium_s", d.diag_medium_s),
    )


def attribution(v: Validator, raw: Mapping[str, Any]) -> AttributionSettings:
    t = v.section("attribution", raw.get("attribution", {}), names(AttributionSettings))
    label = t.t.get("container_owner_label")
    if label is not None and not (isinstance(label, str) and LABEL.fullmatch(label)):
        raise ConfigError(
            f"{v.where}: attribution.container_owner_label: expected a label key like "
            f'"owner" or "com.example.owner", got {label!r}'
        )
    return AttributionSettings(
        label, t.positive("lookup_timeout_s", AttributionSettings.lookup_timeout_s)
    )


MAX_LEASE_S = 3600.0


def leases(v: Validator, raw: Mapping[str, Any]) -> LeaseSettings:
    """Validate ``[leases]``: a renewal at most every half ttl (one may fail and none is lost)."""
    t = v.section("leases", raw.get("leases", {}), names(LeaseSettings))
    ttl = t.seconds("ttl_s", LeaseSettings.ttl_s, MAX_LEASE_S)
    renew = t.seconds("renew_s", LeaseSettings.renew_s, MAX_LEASE_S)
    if renew * 2 > ttl:
        raise ConfigError(
            f"{v.where}: leases.renew_s: {renew:g} s is more than half of leases.ttl_s "
            f"({ttl:g} s): one late renewal would lose the lease"
        )
    return LeaseSettings(ttl, renew)


def audit(v: Validator, raw: Mapping[str, Any]) -> AuditSettings:
    t = v.section(
        "audit",
        raw.get("audit", {}),
        {"publish_head_every", "seal_every", "max_seal_age", "head_file"},
    ).t
    publish = _every(v, "audit.publish_head_every", t.get("publish_head_every", "24h"))
    seal = _every(v, "audit.seal_every", t.get("seal_every", "15m"))
    age_raw = t.get("max_seal_age")
    age = None if age_raw in (None, "off") else _every(v, "audit.max_seal_age", age_raw)
    if age is not None and seal is not None and age < seal:
        raise ConfigError(
            f"{v.where}: audit.max_seal_age: {age_raw} is shorter than audit.seal_every "
            f"({t.get('seal_every', '15m')}): every verify between two seals would fail"
        )
    head_file = t.get("head_file")
    if head_file is not None:
        head_file = os.path.expanduser(v.string("audit.head_file", head_file))
        if not os.path.isabs(head_file) or head_file.endswith("/"):
            raise ConfigError(
                f"{v.where}: audit.head_file: expected an absolute file path like "
                f'"/var/lib/gpubot/audit.head", got {t["head_file"]!r}'
            )
    return AuditSettings(publish, seal, age, age_raw != "off", head_file)


def _every(v: Validator, key: str, value: Any) -> float | None:
    """Return an ``[audit]`` interval of at least a minute in seconds; None for "off"."""
    if value == "off":
        return None
    try:
        seconds = durations.parse(value)
    except ValueError:
        seconds = 0.0
    if seconds < MIN_PUBLISH_S:
        raise ConfigError(
            f"{v.where}: {key}: expected a duration of at least 1m like "
            f'"24h", "30m", "7d", or "off", got {value!r}'
        )
    return seconds
