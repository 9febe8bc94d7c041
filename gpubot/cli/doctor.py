"""``gpubot doctor [NODE|GROUP ...] [--json]``: one checklist of what must be right, ✓ or ✗,
each ✗ with the one line that fixes it; exit 1 when anything fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence

from gpubot.app import doctor_service
from gpubot.app.sources import restd_reader, slurm_rest
from gpubot.cli.serve import DEFAULT_API_URL
from gpubot.config import Settings, audit_key, config_path
from gpubot.config.doctor import config_checks
from gpubot.core.doctor.checks import Check, all_ok, as_document, failed, passed, render
from gpubot.core.doctor.facts import DbFacts
from gpubot.core.doctor.limits import descriptor_check
from gpubot.core.models import NodeConfig
from gpubot.errors import ConfigError
from gpubot.services.doctor import DoctorParts


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "targets", nargs="*", metavar="NODE|GROUP", help="nodes or groups (default: all)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")


def run(args: argparse.Namespace) -> int:
    """Print the checklist; exit 0 when every check holds, 1 otherwise."""
    from gpubot.transport.descriptors import limits

    checks, settings = config_checks(config_path(args.config, os.environ), os.environ)
    if settings is not None:  # this process's descriptor limits against the whole fleet's size
        checks.append(descriptor_check(len(settings.nodes), *limits()))
        picked = pick(settings, args.targets)
        if isinstance(picked, Check):
            checks.append(picked)
        else:
            checks += asyncio.run(_rest(settings, picked, os.environ))
    if args.json:
        print(json.dumps(as_document(checks), indent=2))
    else:
        print(render(checks))
    return 0 if all_ok(checks) else 1


def pick(settings: Settings, names: Sequence[str]) -> tuple[NodeConfig, ...] | Check:
    """Return the nodes named (nodes or groups; none: all), or the check that says which is not."""
    if not names or "all" in names:
        return settings.nodes
    groups = settings.groups()
    wanted: set[str] = set()
    for name in names:
        if settings.node(name) is not None:
            wanted.add(name)
        elif name in groups:
            wanted.update(groups[name])
        else:
            known = ", ".join(n.name for n in settings.nodes) or "none"
            return failed("config", f"node {name}", "no such node or group", f"one of: {known}")
    return tuple(n for n in settings.nodes if n.name in wanted)


async def _rest(
    settings: Settings, nodes: Sequence[NodeConfig], environ: Mapping[str, str]
) -> list[Check]:
    from gpubot.transport.hostkey import presented_fingerprint

    async def fingerprint(node: NodeConfig) -> str | None:
        return await presented_fingerprint(node, settings.ssh.connect_timeout_s)

    restd = slurm_rest(settings, environ)
    parts = DoctorParts(
        fingerprint, _chat(environ), lambda: _database(settings, environ), restd_reader(restd)
    )
    service = doctor_service(settings, parts)
    try:
        return await service.check(nodes)
    finally:
        await service.transport.close()
        if restd is not None:
            await restd.close()


def _chat(environ: Mapping[str, str]) -> Callable[[Settings], Awaitable[list[Check]]]:
    """Slack's checks, then Matrix's when the settings file has a ``[matrix]`` section."""
    slack = _slack(environ) or _unchecked

    async def checks(settings: Settings) -> list[Check]:
        from pathlib import Path

        from gpubot.matrix.doctor import check_file

        said = await slack(settings)
        return said + await check_file(Path(settings.path or "gpubot.toml"), environ)

    return checks


def _slack(environ: Mapping[str, str]) -> Callable[[Settings], Awaitable[list[Check]]] | None:
    token = environ.get("SLACK_BOT_TOKEN", "").strip()
    if not token:
        return _unchecked
    url = environ.get("SLACK_API_URL", "").strip() or DEFAULT_API_URL
    url = url if url.endswith("/") else url + "/"

    async def checks(settings: Settings) -> list[Check]:
        from gpubot.slack.doctor import check

        return await check(token, url, settings)

    return checks


async def _unchecked(settings: Settings) -> list[Check]:
    return [passed("slack", "not checked", "SLACK_BOT_TOKEN is not set")]


def _database(settings: Settings, environ: Mapping[str, str]) -> DbFacts:
    from gpubot.store.doctor import database_facts

    try:
        key = audit_key(environ)
    except ConfigError:
        key = None  # said among the settings checks
    password = environ.get("GPUBOT_DB_PASSWORD") or None
    return database_facts(settings.database_url, password=password, audit_key=key)
