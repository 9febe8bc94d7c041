"""``[[nodes]]`` and ``[groups.NAME]`` (a node takes its groups' runtimes, scheduler and GPU
count), and ``[slurm]`` for the nodes whose scheduler is Slurm.

Every problem is a ``ConfigError`` whose message is one line: the file, the key, what is wrong.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gpubot.config.validate import Table, Validator, names
from gpubot.core import durations
from gpubot.core.health.state import FABRIC_MANAGER_PID
from gpubot.core.models import NodeConfig
from gpubot.core.names import NODE_NAME
from gpubot.core.runtimes import LOOKUPS
from gpubot.core.slurm import SCHEDULERS, SLURM, SlurmSettings
from gpubot.core.telemetry import PROMETHEUS, SSH, TELEMETRIES, PromLabels, PromSettings
from gpubot.errors import ConfigError

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# http(s)://host[:port][/path]: no user (a password belongs nowhere here), query or fragment
RESTD_URL = re.compile(
    r"https?://(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~/-]*)?"
)
LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
LABEL_KEYS = ("node", "uuid", "gpu", "model")
RUNTIMES = tuple(LOOKUPS)  # the runtimes gpubot can ask for names (core.runtimes)


def nodes(v: Validator, raw: Mapping[str, Any]) -> tuple[NodeConfig, ...]:
    """Validate ``[[nodes]]`` and ``[groups.NAME]`` (a node takes its groups' runtimes)."""
    nodes_raw = raw.get("nodes", [])
    if not isinstance(nodes_raw, list):
        raise ConfigError(f"{v.where}: nodes: expected [[nodes]] tables")
    seen: set[str] = set()
    groups = {
        name: v.section(f"groups.{name}", t, {"runtimes", "scheduler", "gpus", "telemetry"})
        for name, t in v.table("groups", raw.get("groups", {})).items()
    }
    group_runtimes = {name: _runtimes(t) for name, t in groups.items()}
    group_schedulers = {name: s for name, t in groups.items() if (s := _scheduler(t)) is not None}
    group_gpus = {name: c for name, t in groups.items() if (c := _gpus(t)) is not None}
    prom_groups = {name for name, t in groups.items() if _telemetry(t) == PROMETHEUS}
    out = tuple(
        _node(v, f"nodes[{i}]", n, seen, group_runtimes, group_schedulers, group_gpus, prom_groups)
        for i, n in enumerate(nodes_raw)
    )
    used = {g for n in out for g in n.groups}
    for g in group_runtimes:
        if g not in used:
            raise ConfigError(f"{v.where}: groups.{g}: no node is in group {g!r}")
    return out


def _telemetry(t: Table) -> str:
    """Return a group's ``telemetry``: "ssh" (the default) or "prometheus"."""
    value = t.t.get("telemetry", SSH)
    if value not in TELEMETRIES:
        raise ConfigError(
            f"{t.v.where}: {t.name}.telemetry: expected one of {', '.join(TELEMETRIES)}, "
            f"got {value!r}"
        )
    return str(value)


def _node_telemetry(t: Table, groups: list[str], prom_groups: set[str]) -> str:
    """The node's own ``telemetry``, else "prometheus" where one of its groups says so."""
    if "telemetry" in t.t:
        return _telemetry(t)
    return PROMETHEUS if prom_groups.intersection(groups) else SSH


def prometheus(v: Validator, raw: Mapping[str, Any]) -> PromSettings:
    """Validate ``[prometheus]``: ``url``, ``token_env``, ``max_age_s``, ``timeout_s`` and the
    label names (``node_label``, ``uuid_label``, ``gpu_label``, ``model_label``)."""
    keys = {"url", "token_env", "max_age_s", "timeout_s"} | {f"{k}_label" for k in LABEL_KEYS}
    t = v.section(PROMETHEUS, raw.get(PROMETHEUS, {}), keys)
    d = PromSettings()
    url = t.t.get("url")
    if url is not None:
        url = v.string("prometheus.url", url).rstrip("/")
        if not RESTD_URL.fullmatch(url):
            raise ConfigError(
                f'{v.where}: prometheus.url: expected "http://HOST:PORT" (or https), '
                f"got {t.t['url']!r}"
            )
    env = t.string("token_env", d.token_env)
    if not ENV_NAME.fullmatch(env):
        raise ConfigError(
            f"{v.where}: prometheus.token_env: {env!r} is not an environment variable's name "
            "(the token itself belongs in that variable, never in this file)"
        )
    labels = {}
    for k in LABEL_KEYS:
        name = t.string(f"{k}_label", getattr(d.labels, k))
        if not LABEL_NAME.fullmatch(name):
            raise ConfigError(f"{v.where}: prometheus.{k}_label: {name!r} is not a label name")
        labels[k] = name
    return PromSettings(
        url=url,
        token_env=env,
        labels=PromLabels(**labels),
        max_age_s=t.seconds("max_age_s", d.max_age_s, 86400.0),
        timeout_s=t.seconds("timeout_s", d.timeout_s, 120.0),
    )


def _gpus(t: Table) -> int | None:
    """Return ``gpus`` (how many GPUs a node has), or None where it is not set."""
    if "gpus" not in t.t:
        return None
    n = t.t["gpus"]
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 256:
        raise ConfigError(f"{t.v.where}: {t.name}.gpus: {n!r} is not a GPU count (1-256)")
    return n


def _node_gpus(
    t: Table, groups: list[str], group_gpus: Mapping[str, int]
) -> tuple[int | None, str]:
    """Return a node's ``gpus`` (its own, else the first of its groups' that says) and
    ``pci_dir``."""
    gpus = _gpus(t)
    if gpus is None:
        gpus = next((c for g in groups if (c := group_gpus.get(g)) is not None), None)
    pci = t.string("pci_dir", "/sys/bus/pci/devices")
    if not pci.startswith("/"):
        raise ConfigError(f"{t.v.where}: {t.name}.pci_dir: {pci!r} is not an absolute path")
    return gpus, pci


def _runtimes(t: Table) -> tuple[str, ...]:
    found = t.strings("runtimes", [])
    for name in found:
        if name not in RUNTIMES:
            raise ConfigError(
                f"{t.v.where}: {t.name}.runtimes: unknown runtime {name!r} "
                f"(one of {', '.join(RUNTIMES)})"
            )
    return found


def _scheduler(t: Table) -> str | None:
    found = t.t.get("scheduler")
    if found is not None and found not in SCHEDULERS:
        raise ConfigError(
            f"{t.v.where}: {t.name}.scheduler: unknown scheduler {found!r} "
            f"(one of {', '.join(SCHEDULERS)})"
        )
    return found


def _node_scheduler(
    v: Validator, key: str, t: Table, groups: list[str], group_schedulers: Mapping[str, str]
) -> tuple[str | None, str | None]:
    """Return a node's scheduler (its own, else its groups'; two that differ are refused) and
    its ``slurm_node``."""
    scheduler = _scheduler(t)
    for g in groups:
        theirs = group_schedulers.get(g)
        if scheduler is not None and theirs is not None and theirs != scheduler:
            raise ConfigError(
                f"{v.where}: {key}.scheduler: {scheduler!r}, but its group {g!r} says {theirs!r}"
            )
        scheduler = scheduler or theirs
    slurm_node = t.t.get("slurm_node")
    if slurm_node is not None and not NODE_NAME.fullmatch(
        v.string(f"{key}.slurm_node", slurm_node)
    ):
        raise ConfigError(f"{v.where}: {key}.slurm_node: {slurm_node!r} is not a node name")
    return scheduler, slurm_node


def slurm(v: Validator, raw: Mapping[str, Any]) -> SlurmSettings:
    """Validate ``[slurm]``: ``unused_after`` (a duration), ``claims``, ``timeout_s``, and the
    cluster's slurmrestd (``restd_url``, ``restd_user``, ``restd_token_env``)."""
    keys = {"unused_after", "claims", "timeout_s", "restd_url", "restd_user", "restd_token_env"}
    t = v.section(SLURM, raw.get(SLURM, {}), keys)
    d = SlurmSettings()
    try:
        unused = durations.parse(t.t.get("unused_after", "30m"))
    except ValueError as exc:
        raise ConfigError(f"{v.where}: slurm.unused_after: {exc}") from None
    url, user = _restd(v, t)
    env = t.string("restd_token_env", d.restd_token_env)
    if not ENV_NAME.fullmatch(env):
        raise ConfigError(
            f"{v.where}: slurm.restd_token_env: {env!r} is not an environment variable's name "
            "(the JWT itself belongs in that variable, never in this file)"
        )
    return SlurmSettings(
        unused_after_s=unused,
        claims=t.boolean("claims", d.claims),
        timeout_s=t.seconds("timeout_s", d.timeout_s, 120.0),
        restd_url=url,
        restd_user=user,
        restd_token_env=env,
    )


def _restd(v: Validator, t: Table) -> tuple[str | None, str | None]:
    """``restd_url`` (http or https, a host, no user, query or fragment) and its user."""
    url = t.t.get("restd_url")
    user = t.t.get("restd_user")
    if url is None:
        if user is not None:
            raise ConfigError(f"{v.where}: slurm.restd_user: set only with slurm.restd_url")
        return None, None
    text = v.string("slurm.restd_url", url).rstrip("/")
    if not RESTD_URL.fullmatch(text):
        raise ConfigError(
            f'{v.where}: slurm.restd_url: expected "http://HOST:PORT" (or https), got {url!r}'
        )
    if user is None or not NODE_NAME.fullmatch(v.string("slurm.restd_user", user)):
        raise ConfigError(
            f"{v.where}: slurm.restd_user: the Slurm user the JWT is for (a user name), "
            f"got {user!r}"
        )
    return text, user


def _node(
    v: Validator,
    key: str,
    n: Any,
    seen: set[str],
    group_runtimes: Mapping[str, tuple[str, ...]],
    group_schedulers: Mapping[str, str],
    group_gpus: Mapping[str, int] | None = None,
    prom_groups: set[str] | None = None,
) -> NodeConfig:
    t = v.section(key, n, names(NodeConfig))
    if "name" not in t.t or "host" not in t.t:
        raise ConfigError(f"{v.where}: {key}: 'name' and 'host' are required")
    name = v.string(f"{key}.name", t.t["name"])
    if not NODE_NAME.fullmatch(name):
        raise ConfigError(f"{v.where}: {key}.name: {name!r} must match {NODE_NAME.pattern}")
    if name in seen:
        raise ConfigError(f"{v.where}: {key}.name: duplicate node name {name!r}")
    seen.add(name)
    port = t.t.get("port", 22)
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise ConfigError(f"{v.where}: {key}.port: {port!r} is not a port number (1-65535)")
    groups = t.t.get("groups", [])
    if not isinstance(groups, list) or not all(
        isinstance(g, str) and NODE_NAME.fullmatch(g) for g in groups
    ):
        raise ConfigError(f"{v.where}: {key}.groups: expected a list of group names")
    if name in groups:
        raise ConfigError(f"{v.where}: {key}.groups: a group cannot be named like its node")
    sudo = t.boolean("sudo", False)
    runtimes = list(_runtimes(t))
    for g in groups:
        runtimes += [r for r in group_runtimes.get(g, ()) if r not in runtimes]
    scheduler, slurm_node = _node_scheduler(v, key, t, groups, group_schedulers)
    fm = t.string("fabricmanager_pid", FABRIC_MANAGER_PID)
    if not fm.startswith("/"):
        raise ConfigError(f"{v.where}: {key}.fabricmanager_pid: {fm!r} is not an absolute path")
    user, keyf = t.t.get("user"), t.t.get("key")
    gpus, pci = _node_gpus(t, groups, group_gpus or {})
    return NodeConfig(
        name=name,
        host=t.string("host", ""),
        port=port,
        user=None if user is None else t.string("user", ""),
        key=None if keyf is None else t.string("key", ""),
        dev_prefix=t.string("dev_prefix", "/dev/nvidia"),
        sudo=sudo,
        groups=tuple(groups),
        nvidia_smi=t.string("nvidia_smi", "nvidia-smi"),
        driver_dir=t.string("driver_dir", "/proc/driver/nvidia"),
        fabricmanager_pid=fm,
        runtimes=tuple(runtimes),
        scheduler=scheduler,
        slurm_node=slurm_node,
        gpus=gpus,
        pci_dir=pci,
        telemetry=_node_telemetry(t, groups, prom_groups or set()),
    )
