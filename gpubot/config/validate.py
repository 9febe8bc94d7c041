"""The one validator of settings tables, and the general sections: ``[database]``, ``[ssh]``,
``[reset]``, ``[[nodes]]``, ``[groups]``, ``[attribution]``, ``[audit]``.

Every problem is a ``ConfigError`` whose message is one line: the file, the key, what is wrong.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
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
from gpubot.core.health.state import FABRIC_MANAGER_PID
from gpubot.core.models import NodeConfig
from gpubot.core.names import NODE_NAME
from gpubot.core.runtimes import LOOKUPS
from gpubot.errors import ConfigError

LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")
MIN_PUBLISH_S = 60.0  # an [audit] interval under a minute is noise, likely a typo
RUNTIMES = tuple(LOOKUPS)  # the runtimes gpubot can ask for names (core.runtimes)


class UnknownKey(ConfigError):
    """A key the settings do not know (``gpubot doctor`` lists them all, with their fix)."""

    def __init__(self, where: str, section: str, key: str, allowed: set[str]) -> None:
        self.section = section
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
                raise UnknownKey(self.where, section, k, allowed)

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


def check_port(value: Any, what: str) -> int:
    """Return ``value`` as a TCP port number or raise ``ConfigError`` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise ConfigError(f"{what}: {value!r} is not a port number (0-65535, 0: any free port)")
    return value


def database(v: Validator, raw: Mapping[str, Any]) -> str:
    """Return ``[database] url`` (never with a password in it)."""
    db = v.table("database", raw.get("database", {}))
    v.keys("database", db, {"url"})
    url = v.string("database.url", db.get("url", "sqlite:///gpubot.db"))
    if "@" in url and ":" in url.split("@", 1)[0].split("//", 1)[-1]:
        raise ConfigError(
            f"{v.where}: database.url: put the password in $GPUBOT_DB_PASSWORD, not here"
        )
    return url


def ssh(v: Validator, raw: Mapping[str, Any]) -> SshSettings:
    """Validate ``[ssh]``."""
    t = v.table("ssh", raw.get("ssh", {}))
    v.keys(
        "ssh",
        t,
        {"known_hosts", "connect_timeout_s", "command_timeout_s", "max_parallel", "keepalive_s"},
    )
    d = SshSettings()
    return SshSettings(
        known_hosts=v.string("ssh.known_hosts", t.get("known_hosts", d.known_hosts)),
        connect_timeout_s=v.positive(
            "ssh.connect_timeout_s", t.get("connect_timeout_s", d.connect_timeout_s)
        ),
        command_timeout_s=v.positive(
            "ssh.command_timeout_s", t.get("command_timeout_s", d.command_timeout_s)
        ),
        max_parallel=int(
            v.positive("ssh.max_parallel", t.get("max_parallel", d.max_parallel), integer=True)
        ),
        keepalive_s=v.positive("ssh.keepalive_s", t.get("keepalive_s", d.keepalive_s)),
    )


def reset(v: Validator, raw: Mapping[str, Any]) -> ResetSettings:
    """Validate ``[reset]`` (protected daemons by absolute path only)."""
    rr = v.table("reset", raw.get("reset", {}))
    r = ResetSettings()
    v.keys(
        "reset",
        rr,
        {
            "grace_s",
            "verify_timeout_s",
            "free_threshold_mib",
            "poll_interval_s",
            "protected",
            "system_users",
            "toggle_persistence",
            "stop_workloads",
            "respawn_watch_s",
        },
    )
    toggle = v.boolean("reset.toggle_persistence", rr.get("toggle_persistence", False))
    protected = v.strings("reset.protected", rr.get("protected", list(r.protected)))
    for p in protected:
        if not p.startswith("/"):
            raise ConfigError(
                f"{v.where}: reset.protected: {p!r} is not an absolute path: list daemon "
                "executables by path (e.g. /usr/bin/nvidia-persistenced), never by name"
            )
    system_users = v.strings("reset.system_users", rr.get("system_users", list(r.system_users)))
    return ResetSettings(
        grace_s=v.positive("reset.grace_s", rr.get("grace_s", r.grace_s), zero=True),
        verify_timeout_s=v.positive(
            "reset.verify_timeout_s", rr.get("verify_timeout_s", r.verify_timeout_s)
        ),
        free_threshold_mib=int(
            v.positive(
                "reset.free_threshold_mib",
                rr.get("free_threshold_mib", r.free_threshold_mib),
                integer=True,
                zero=True,
            )
        ),
        poll_interval_s=v.positive(
            "reset.poll_interval_s", rr.get("poll_interval_s", r.poll_interval_s)
        ),
        protected=protected,
        system_users=system_users,
        toggle_persistence=toggle,
        stop_workloads=v.boolean("reset.stop_workloads", rr.get("stop_workloads", False)),
        respawn_watch_s=v.positive(
            "reset.respawn_watch_s", rr.get("respawn_watch_s", r.respawn_watch_s), zero=True
        ),
    )


def nodes(v: Validator, raw: Mapping[str, Any]) -> tuple[NodeConfig, ...]:
    """Validate ``[[nodes]]`` and ``[groups.NAME]`` (a node takes its groups' runtimes)."""
    nodes_raw = raw.get("nodes", [])
    if not isinstance(nodes_raw, list):
        raise ConfigError(f"{v.where}: nodes: expected [[nodes]] tables")
    out: list[NodeConfig] = []
    seen: set[str] = set()
    group_runtimes = _groups(v, raw)
    for i, n in enumerate(nodes_raw):
        out.append(_node(v, f"nodes[{i}]", n, seen, group_runtimes))
    used = {g for n in out for g in n.groups}
    for g in group_runtimes:
        if g not in used:
            raise ConfigError(f"{v.where}: groups.{g}: no node is in group {g!r}")
    return tuple(out)


def _runtimes(v: Validator, key: str, value: Any) -> tuple[str, ...]:
    names = v.strings(key, value)
    for name in names:
        if name not in RUNTIMES:
            raise ConfigError(
                f"{v.where}: {key}: unknown runtime {name!r} (one of {', '.join(RUNTIMES)})"
            )
    return names


def _groups(v: Validator, raw: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """Return each ``[groups.NAME]`` table's runtimes."""
    out: dict[str, tuple[str, ...]] = {}
    for name, t in v.table("groups", raw.get("groups", {})).items():
        key = f"groups.{name}"
        t = v.table(key, t)
        v.keys(key, t, {"runtimes"})
        out[name] = _runtimes(v, f"{key}.runtimes", t.get("runtimes", []))
    return out


def attribution(v: Validator, raw: Mapping[str, Any]) -> AttributionSettings:
    """Validate ``[attribution]``."""
    t = v.table("attribution", raw.get("attribution", {}))
    v.keys("attribution", t, {"container_owner_label", "lookup_timeout_s"})
    label = t.get("container_owner_label")
    if label is not None and not (isinstance(label, str) and LABEL.fullmatch(label)):
        raise ConfigError(
            f"{v.where}: attribution.container_owner_label: expected a label key like "
            f'"owner" or "com.example.owner", got {label!r}'
        )
    d = AttributionSettings()
    timeout = v.positive(
        "attribution.lookup_timeout_s", t.get("lookup_timeout_s", d.lookup_timeout_s)
    )
    return AttributionSettings(label, timeout)


MAX_LEASE_S = 3600.0


def leases(v: Validator, raw: Mapping[str, Any]) -> LeaseSettings:
    """Validate ``[leases]``: a renewal at most every half ttl (one may fail and none is lost)."""
    t = v.table("leases", raw.get("leases", {}))
    v.keys("leases", t, {"ttl_s", "renew_s"})
    d = LeaseSettings()
    ttl = v.seconds("leases.ttl_s", t.get("ttl_s", d.ttl_s), MAX_LEASE_S)
    renew = v.seconds("leases.renew_s", t.get("renew_s", d.renew_s), MAX_LEASE_S)
    if renew * 2 > ttl:
        raise ConfigError(
            f"{v.where}: leases.renew_s: {renew:g} s is more than half of leases.ttl_s "
            f"({ttl:g} s): one late renewal would lose the lease"
        )
    return LeaseSettings(ttl, renew)


AUDIT_KEYS = {"publish_head_every", "seal_every", "max_seal_age", "head_file"}


def audit(v: Validator, raw: Mapping[str, Any]) -> AuditSettings:
    """Validate ``[audit]``."""
    t = v.table("audit", raw.get("audit", {}))
    v.keys("audit", t, AUDIT_KEYS)
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


NODE_KEYS = {
    "name",
    "host",
    "port",
    "user",
    "key",
    "dev_prefix",
    "sudo",
    "groups",
    "nvidia_smi",
    "driver_dir",
    "fabricmanager_pid",
    "runtimes",
}


def _fm_pid(v: Validator, key: str, t: Mapping[str, Any]) -> str:
    fm = v.string(f"{key}.fabricmanager_pid", t.get("fabricmanager_pid", FABRIC_MANAGER_PID))
    if not fm.startswith("/"):
        raise ConfigError(f"{v.where}: {key}.fabricmanager_pid: {fm!r} is not an absolute path")
    return fm


def _node(
    v: Validator, key: str, n: Any, seen: set[str], group_runtimes: Mapping[str, tuple[str, ...]]
) -> NodeConfig:
    t = v.table(key, n)
    v.keys(key, t, NODE_KEYS)
    if "name" not in t or "host" not in t:
        raise ConfigError(f"{v.where}: {key}: 'name' and 'host' are required")
    name = v.string(f"{key}.name", t["name"])
    if not NODE_NAME.fullmatch(name):
        raise ConfigError(f"{v.where}: {key}.name: {name!r} must match {NODE_NAME.pattern}")
    if name in seen:
        raise ConfigError(f"{v.where}: {key}.name: duplicate node name {name!r}")
    seen.add(name)
    port = t.get("port", 22)
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise ConfigError(f"{v.where}: {key}.port: {port!r} is not a port number (1-65535)")
    groups = t.get("groups", [])
    if not isinstance(groups, list) or not all(
        isinstance(g, str) and NODE_NAME.fullmatch(g) for g in groups
    ):
        raise ConfigError(f"{v.where}: {key}.groups: expected a list of group names")
    if name in groups:
        raise ConfigError(f"{v.where}: {key}.groups: a group cannot be named like its node")
    sudo = v.boolean(f"{key}.sudo", t.get("sudo", False))
    runtimes = list(_runtimes(v, f"{key}.runtimes", t.get("runtimes", [])))
    for g in groups:
        runtimes += [r for r in group_runtimes.get(g, ()) if r not in runtimes]
    user = t.get("user")
    keyf = t.get("key")
    fm = _fm_pid(v, key, t)
    return NodeConfig(
        name=name,
        host=v.string(f"{key}.host", t["host"]),
        port=port,
        user=None if user is None else v.string(f"{key}.user", user),
        key=None if keyf is None else v.string(f"{key}.key", keyf),
        dev_prefix=v.string(f"{key}.dev_prefix", t.get("dev_prefix", "/dev/nvidia")),
        sudo=sudo,
        groups=tuple(groups),
        nvidia_smi=v.string(f"{key}.nvidia_smi", t.get("nvidia_smi", "nvidia-smi")),
        driver_dir=v.string(f"{key}.driver_dir", t.get("driver_dir", "/proc/driver/nvidia")),
        fabricmanager_pid=fm,
        runtimes=tuple(runtimes),
    )
