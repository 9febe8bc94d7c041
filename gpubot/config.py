"""Settings: one frozen object, loaded once from TOML (+ environment for secrets), passed down.

Every problem is a ``ConfigError`` whose message names the file, the key and what is wrong.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpubot.core.models import NodeConfig
from gpubot.core.protect import DEFAULT_DAEMON_PATHS, DEFAULT_SYSTEM_USERS, Protection
from gpubot.errors import ConfigError

LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
DURATION = re.compile(r"\s*([0-9]{1,9})\s*([smhdw])\s*")
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
MIN_PUBLISH_S = 60.0  # a head posted more often than once a minute is noise, likely a typo
AUDIT_KEY_ENV = "GPUBOT_AUDIT_KEY"  # makes the audit chain an HMAC chain (see store.chain)
MIN_AUDIT_KEY = 16


@dataclass(frozen=True)
class SshSettings:
    """How gpubot reaches nodes."""

    known_hosts: str = "~/.ssh/known_hosts"
    connect_timeout_s: float = 5.0
    command_timeout_s: float = 20.0
    max_parallel: int = 64
    keepalive_s: float = 15.0


@dataclass(frozen=True)
class ResetSettings:
    """Defaults of the reset engine."""

    grace_s: float = 10.0
    verify_timeout_s: float = 30.0
    free_threshold_mib: int = 256
    poll_interval_s: float = 0.25
    protected: tuple[str, ...] = DEFAULT_DAEMON_PATHS  # daemon executables, absolute paths
    system_users: tuple[str, ...] = DEFAULT_SYSTEM_USERS  # the accounts they must run as
    # gpu-reset of a GPU a daemon holds (persistence mode): nvidia-smi -pm 0 before, -pm 1 after
    toggle_persistence: bool = False
    # A respawned workload: run its stop command (docker stop, scancel, systemctl stop) as part
    # of the reset. False: gpubot only says which command stops it.
    stop_workloads: bool = False
    # A GPU whose target's workload may start it again (a restart policy, a pod, a job, a
    # service) is called freed only once it has stayed free this long.
    respawn_watch_s: float = 3.0

    @property
    def protection(self) -> Protection:
        """Return the protected-daemon rule (see ``core.protect``)."""
        return Protection(self.protected, self.system_users)


@dataclass(frozen=True)
class AuditSettings:
    """The ``[audit]`` settings."""

    publish_head_every_s: float | None = 86400.0  # post the chain head this often; None: never


RUNTIMES = ("docker", "podman", "slurm", "crictl")


@dataclass(frozen=True)
class AttributionSettings:
    """The ``[attribution]`` settings: who a container belongs to, and how long lookups take."""

    # A container belongs to the Linux user this label names; None: every container is root's.
    container_owner_label: str | None = None
    lookup_timeout_s: float = 5.0  # each runtime lookup (docker inspect ...) on a node


@dataclass(frozen=True)
class Settings:
    """Everything gpubot is configured with."""

    path: str | None = None
    database_url: str = "sqlite:///gpubot.db"
    ssh: SshSettings = field(default_factory=SshSettings)
    reset: ResetSettings = field(default_factory=ResetSettings)
    nodes: tuple[NodeConfig, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)  # sections owned by later front ends
    audit: AuditSettings = field(default_factory=AuditSettings)
    attribution: AttributionSettings = field(default_factory=AttributionSettings)

    def node(self, name: str) -> NodeConfig | None:
        """Return the node called ``name`` or None."""
        return next((n for n in self.nodes if n.name == name), None)

    def groups(self) -> dict[str, tuple[str, ...]]:
        """Return each group name with its node names."""
        out: dict[str, list[str]] = {}
        for n in self.nodes:
            for g in n.groups:
                out.setdefault(g, []).append(n.name)
        return {g: tuple(ns) for g, ns in out.items()}


# Sections other issues own; accepted as tables and kept raw in ``Settings.extra``.
EXTRA_SECTIONS = ("slack", "users", "approvals", "permissions", "sweep", "alerts", "metrics")


def config_path(cli_value: str | None, environ: Mapping[str, str]) -> Path:
    """Choose the settings file: ``--config``, else ``$GPUBOT_CONFIG``, else ``./gpubot.toml``."""
    return Path(cli_value or environ.get("GPUBOT_CONFIG") or "gpubot.toml")


def load(path: Path) -> Settings:
    """Load and validate the settings file at ``path``."""
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
    """Validate a decoded TOML document into ``Settings``."""
    v = _Validator(where)
    v.keys("", raw, {"database", "ssh", "reset", "nodes", "audit", "groups", "attribution",
                     *EXTRA_SECTIONS})  # fmt: skip
    db = v.table("database", raw.get("database", {}))
    v.keys("database", db, {"url"})
    url = v.string("database.url", db.get("url", "sqlite:///gpubot.db"))
    if "@" in url and ":" in url.split("@", 1)[0].split("//", 1)[-1]:
        raise ConfigError(
            f"{where}: database.url: put the password in $GPUBOT_DB_PASSWORD, not here"
        )

    ssh_raw = v.table("ssh", raw.get("ssh", {}))
    v.keys("ssh", ssh_raw, {"known_hosts", "connect_timeout_s", "command_timeout_s",
                            "max_parallel", "keepalive_s"})  # fmt: skip
    d = SshSettings()
    ssh = SshSettings(
        known_hosts=v.string("ssh.known_hosts", ssh_raw.get("known_hosts", d.known_hosts)),
        connect_timeout_s=v.positive("ssh.connect_timeout_s",
                                     ssh_raw.get("connect_timeout_s", d.connect_timeout_s)),
        command_timeout_s=v.positive("ssh.command_timeout_s",
                                     ssh_raw.get("command_timeout_s", d.command_timeout_s)),
        max_parallel=int(v.positive("ssh.max_parallel", ssh_raw.get("max_parallel", d.max_parallel),
                                    integer=True)),
        keepalive_s=v.positive("ssh.keepalive_s", ssh_raw.get("keepalive_s", d.keepalive_s)),
    )  # fmt: skip

    rr = v.table("reset", raw.get("reset", {}))
    r = ResetSettings()
    v.keys("reset", rr, {"grace_s", "verify_timeout_s", "free_threshold_mib", "poll_interval_s",
                         "protected", "system_users", "toggle_persistence",
                         "stop_workloads", "respawn_watch_s"})  # fmt: skip
    toggle = v.boolean("reset.toggle_persistence", rr.get("toggle_persistence", False))
    protected = v.strings("reset.protected", rr.get("protected", list(r.protected)))
    for p in protected:
        if not p.startswith("/"):
            raise ConfigError(
                f"{where}: reset.protected: {p!r} is not an absolute path: list daemon "
                "executables by path (e.g. /usr/bin/nvidia-persistenced), never by name"
            )
    system_users = v.strings("reset.system_users",
                             rr.get("system_users", list(r.system_users)))  # fmt: skip
    reset = ResetSettings(
        grace_s=v.positive("reset.grace_s", rr.get("grace_s", r.grace_s), zero=True),
        verify_timeout_s=v.positive("reset.verify_timeout_s",
                                    rr.get("verify_timeout_s", r.verify_timeout_s)),
        free_threshold_mib=int(v.positive("reset.free_threshold_mib",
                                          rr.get("free_threshold_mib", r.free_threshold_mib),
                                          integer=True, zero=True)),
        poll_interval_s=v.positive("reset.poll_interval_s",
                                   rr.get("poll_interval_s", r.poll_interval_s)),
        protected=protected,
        system_users=system_users,
        toggle_persistence=toggle,
        stop_workloads=v.boolean("reset.stop_workloads", rr.get("stop_workloads", False)),
        respawn_watch_s=v.positive("reset.respawn_watch_s",
                                   rr.get("respawn_watch_s", r.respawn_watch_s), zero=True),
    )  # fmt: skip

    nodes_raw = raw.get("nodes", [])
    if not isinstance(nodes_raw, list):
        raise ConfigError(f"{where}: nodes: expected [[nodes]] tables")
    nodes: list[NodeConfig] = []
    seen: set[str] = set()
    group_runtimes = _groups(v, raw)
    for i, n in enumerate(nodes_raw):
        nodes.append(_node(v, f"nodes[{i}]", n, seen, group_runtimes))
    used = {g for n in nodes for g in n.groups}
    for g in group_runtimes:
        if g not in used:
            raise ConfigError(f"{where}: groups.{g}: no node is in group {g!r}")
    extra = {k: v.table(k, raw[k]) for k in EXTRA_SECTIONS if k in raw}
    return Settings(where, url, ssh, reset, tuple(nodes), extra, _audit(v, raw),
                    _attribution(v, raw))  # fmt: skip


def _runtimes(v: _Validator, key: str, value: Any) -> tuple[str, ...]:
    names = v.strings(key, value)
    for name in names:
        if name not in RUNTIMES:
            raise ConfigError(
                f"{v.where}: {key}: unknown runtime {name!r} (one of {', '.join(RUNTIMES)})"
            )
    return names


def _groups(v: _Validator, raw: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """Return each ``[groups.NAME]`` table's runtimes."""
    out: dict[str, tuple[str, ...]] = {}
    for name, t in v.table("groups", raw.get("groups", {})).items():
        key = f"groups.{name}"
        t = v.table(key, t)
        v.keys(key, t, {"runtimes"})
        out[name] = _runtimes(v, f"{key}.runtimes", t.get("runtimes", []))
    return out


def _attribution(v: _Validator, raw: Mapping[str, Any]) -> AttributionSettings:
    t = v.table("attribution", raw.get("attribution", {}))
    v.keys("attribution", t, {"container_owner_label", "lookup_timeout_s"})
    label = t.get("container_owner_label")
    if label is not None and not (isinstance(label, str) and LABEL.fullmatch(label)):
        raise ConfigError(
            f"{v.where}: attribution.container_owner_label: expected a label key like "
            f'"owner" or "com.example.owner", got {label!r}'
        )
    d = AttributionSettings()
    timeout = v.positive("attribution.lookup_timeout_s",
                         t.get("lookup_timeout_s", d.lookup_timeout_s))  # fmt: skip
    return AttributionSettings(label, timeout)


def _audit(v: _Validator, raw: Mapping[str, Any]) -> AuditSettings:
    t = v.table("audit", raw.get("audit", {}))
    v.keys("audit", t, {"publish_head_every"})
    every = t.get("publish_head_every", "24h")
    if every == "off":
        return AuditSettings(None)
    seconds = parse_duration(every)
    if seconds is None or seconds < MIN_PUBLISH_S:
        raise ConfigError(
            f"{v.where}: audit.publish_head_every: expected a duration of at least 1m like "
            f'"24h", "30m", "7d", or "off", got {every!r}'
        )
    return AuditSettings(seconds)


def parse_duration(value: Any) -> float | None:
    """Return the seconds of ``"90s"``, ``"30m"``, ``"24h"``, ``"7d"`` or ``"1w"`` (else None)."""
    m = DURATION.fullmatch(value) if isinstance(value, str) else None
    return None if m is None else float(int(m[1]) * DURATION_UNITS[m[2]])


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


def _node(
    v: _Validator, key: str, n: Any, seen: set[str], group_runtimes: Mapping[str, tuple[str, ...]]
) -> NodeConfig:
    t = v.table(key, n)
    v.keys(key, t, {"name", "host", "port", "user", "key", "dev_prefix", "sudo", "groups",
                    "nvidia_smi", "driver_dir", "runtimes"})  # fmt: skip
    if "name" not in t or "host" not in t:
        raise ConfigError(f"{v.where}: {key}: 'name' and 'host' are required")
    name = v.string(f"{key}.name", t["name"])
    if not NODE_NAME.fullmatch(name):
        raise ConfigError(
            f"{v.where}: {key}.name: {name!r} must match [A-Za-z0-9][A-Za-z0-9._-]{{0,62}}"
        )
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
        runtimes=tuple(runtimes),
    )


class _Validator:
    def __init__(self, where: str) -> None:
        self.where = where

    def keys(self, section: str, table: Mapping[str, Any], allowed: set[str]) -> None:
        for k in table:
            if k not in allowed:
                name = f"{section}.{k}" if section else k
                raise ConfigError(f"{self.where}: {name}: unknown key")

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
            raise ConfigError(f"{self.where}: {key}: expected {kind} > 0, got {value!r}")
        return float(value)


def expand(path: str) -> str:
    """Expand ``~`` in a configured path."""
    return os.path.expanduser(path)
