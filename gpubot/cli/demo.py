"""``gpubot demo``: the real code paths on a throw-away simulated fleet, shown as Slack would.

Four simulated nodes (in-process SSH servers on 127.0.0.1, real processes): one healthy and busy,
one with a process that ignores SIGTERM, one with leaked VRAM, one unreachable. SQLite in a
temporary folder; no GPU, sshd, database server or Slack needed. All it starts, it stops.

Its people are the story's: dana (the operator), alice and bob (researchers) run the jobs and
olga approves. Run as root, the fleet gives them uids of their own that only the simulated nodes
name (``gpusim.people``: no account is added to this host); run as anyone else, every job is
yours, as no other uid can be taken. It ends by running ``gpubot audit verify --expect-head``
with the head it printed, ``SEQ:HASH``, as an admin would check a head noted elsewhere.

It also serves ``gpubot sim`` (``add_sim_arguments``, ``run_sim``: ``gpusim.cli``). The simulator
is a distribution of its own (``sim/``, the ``demo`` extra), and this is the one module of gpubot
that imports it: lazily, inside ``_simulator()``, which turns its errors (``gpusim.errors``) and
its absence into gpubot's one-line errors, so the product runs without it. Each command imports
only what it runs, so ``gpubot sim`` loads no part of the bot.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from gpubot.errors import GpubotError, UsageError

if TYPE_CHECKING:
    from datetime import datetime

    from gpubot.app import App
    from gpubot.core.alerting import AlertGroup, Lookup, MessageRef, Posted
    from gpubot.core.policy import Person
    from gpusim.fleet import SimFleet

OPERATOR, REQUESTER, ONCALL = "U0DANA", "U0ALICE", "U0OLGA"
PEOPLE = ("dana", "alice", "bob")  # the simulated nodes' users (root: uids of their own)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--interactive",
        action="store_true",
        help="drop into `gpubot console` on the demo fleet instead of the walk-through",
    )


@contextmanager
def _simulator() -> Iterator[None]:
    """Run simulator code: its errors become gpubot's (bad input a ``UsageError``), and so does
    a missing ``gpusim`` (the product installs and runs without it; only these commands need it)."""
    try:
        from gpusim.errors import SimError, SimUsageError
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "gpusim":
            raise
        raise UsageError(
            "the simulated fleet (package gpusim) is not installed: pip install 'gpubot[demo]', "
            "or from gpubot's repository pip install -e ./sim"
        ) from None
    try:
        yield
    except SimUsageError as exc:
        raise UsageError(str(exc)) from None
    except SimError as exc:
        raise GpubotError(str(exc)) from None


def add_sim_arguments(p: argparse.ArgumentParser) -> None:
    with _simulator():
        from gpusim import cli

        cli.add_arguments(p)


def run_sim(args: argparse.Namespace) -> int:
    with _simulator():
        from gpusim import cli

        return cli.run(args)


def run(args: argparse.Namespace) -> int:
    """Run the walk-through (or a console) on a simulated fleet; leave nothing behind."""
    from gpubot.app import open_app_store
    from gpubot.config import load

    with _simulator():
        from gpusim.fleet import SimFleet

        people = PEOPLE if os.geteuid() == 0 else ()
        # The story's people run as themselves on a fleet that gives them uids, else as you.
        cast = {name: name if people else None for name in PEOPLE}
        with (
            tempfile.TemporaryDirectory(prefix="gpubot-demo-", ignore_cleanup_errors=True) as tmp,
            SimFleet(
                Path(tmp) / "fleet", nodes=4, gpus=4, release_delay_s=0.5, people=people
            ) as sim,
        ):
            folder = Path(tmp)
            cfg = _write_config(sim, folder, cast["dana"])
            store = open_app_store(load(cfg), {}, check_schema=False)
            store.upgrade()
            store.close()
            _stage(sim, cast)
            if args.interactive:
                return _console(cfg, cast["dana"])
            status, head = asyncio.run(_main(cfg, cast["dana"]))
            if head is not None:
                status = status or _verify_head(cfg, head)
    return status


def _verify_head(cfg: Path, head: str) -> int:
    """Run ``gpubot audit verify --expect-head HEAD`` on the demo's log; return its status."""
    argv = ["gpubot", "--config", str(cfg), "audit", "verify", "--expect-head", head]
    _say("7. " + " ".join(argv[:1] + argv[3:]) + "  (the head noted above: SEQ:HASH)")
    done = subprocess.run(
        [sys.executable, "-m", *argv], capture_output=True, text=True, timeout=60, check=False
    )
    print((done.stdout + done.stderr).strip())
    return done.returncode


def _write_config(sim: SimFleet, folder: Path, operator: str | None) -> Path:
    cfg = folder / "gpubot.toml"
    db = f'url = "sqlite:///{folder}/gpubot.db"'
    text = re.sub(r'(?m)^url = "sqlite:///.*"$', db, sim.config_path.read_text(), count=1)
    cfg.write_text(
        text
        + f"""
[reset]
grace_s = 2
verify_timeout_s = 8
poll_interval_s = 0.1

[slack]
channel = "C0GPUOPS"
oncall_channel = "C0ONCALL"

[users]
{OPERATOR} = "{operator or getpass.getuser()}"
{REQUESTER} = "alice"
{ONCALL} = "olga"

[approvals]
approvers = ["{ONCALL}"]

[sweep]
interval_s = 300
orphan_threshold_mib = 1024
"""
    )
    return cfg


def _stage(sim: SimFleet, cast: dict[str, str | None]) -> None:
    """Put the demo's processes on the fleet: bob's and alice's jobs on node1, dana's stubborn
    one on node2, bob's leak on node3."""
    n1, n2, n3, n4 = sim.nodes
    n1.spawn(gpu=0, mib=61440, util_pct=93, name="python3", user=cast["bob"])
    n1.spawn(gpu=1, mib=30720, util_pct=71, name="python3", user=cast["alice"])
    n2.spawn(gpu=1, mib=40960, behaviour="stubborn", util_pct=0, name="python3", user=cast["dana"])
    leak = n3.spawn(gpu=2, mib=81920, behaviour="orphan", name="python3", user=cast["bob"])
    os.kill(leak.pid, signal.SIGKILL)  # dies; its memory stays allocated: the VRAM leak
    n4.stop_server()


def _say(title: str) -> None:
    print(f"\n━━ {title}")


def _built(cfg: Path, operator: str | None) -> tuple[App, Person]:
    """Build the demo's app on ``cfg`` (its alerts printed as text) and dana."""
    from gpubot.app import build
    from gpubot.config import load
    from gpubot.console.front import ConsoleFront
    from gpubot.core.policy import Person

    app = build(load(cfg), {}, need_store=True, front=ConsoleFront(notifier=_PrintAlerts()))
    return app, Person(OPERATOR, "dana", operator or getpass.getuser())


def _console(cfg: Path, operator: str | None) -> int:
    from gpubot.cli.console import console_parts
    from gpubot.console.terminal import Prompt, banner, session

    app, dana = _built(cfg, operator)
    print(f"demo fleet: 4 nodes; you are dana (Linux user {dana.linux_user}). Try /gpu status all")
    return session(console_parts(app), dana, Prompt(banner(dana)))


async def _main(cfg: Path, operator: str | None) -> tuple[int, str | None]:
    """Run the walk-through; return its status and the audit head it printed."""
    app, dana = _built(cfg, operator)
    try:
        return await _walk(app, dana)
    finally:
        await app.close()


async def _walk(app: App, operator: Person) -> tuple[int, str | None]:
    from gpubot.chat.alerts import render_sweep
    from gpubot.console.repl import answer
    from gpubot.console.text_render import render_text as message_text
    from gpubot.core.policy import Person

    started = time.monotonic()
    ask = app.flows
    alice = Person(REQUESTER, "alice", "alice")
    olga = Person(ONCALL, "olga", "olga")

    _say("1. /gpu status all  (what is on the GPUs right now?)")
    print(await answer(ask, "/gpu status all", operator))

    _say("2. the scheduled sweep, twice (a finding must persist across two sweeps to alert)")
    await app.sweep.run(alerting=True, source="demo", actor="gpubot:demo")
    result = await app.sweep.run(alerting=True, source="demo", actor="gpubot:demo")
    print(message_text(render_sweep(result)))

    _say("3. dana frees her own GPU: /gpu reset node2 gpu 1  (the process ignores SIGTERM)")
    print(await answer(ask, "/gpu reset node2 gpu 1 grace 1", operator))

    _say("4. alice asks to free node1 GPU 0, held by bob's job: a forced kill")
    print(await answer(ask, "/gpu reset node1 gpu 0", alice))
    store = app.store
    assert store is not None  # build(need_store=True) opened it
    pending = await store.approvals.pending()
    if pending:
        _say(f"   the on-call responder olga approves: approve {pending[0].id}")
        print(await answer(ask, f"approve {pending[0].id}", olga))

    _say("5. the leaked VRAM on node3: /gpu gpu-reset node3 gpu 2")
    print(await answer(ask, "/gpu gpu-reset node3 gpu 2", operator))

    _say("6. gpubot audit verify")
    verdict = await store.verify()
    print(verdict.line())  # "audit log intact: N records, head SEQ:HASH, ..."
    _say(f"steps 1-6 took {time.monotonic() - started:.1f} s")
    return (0, verdict.head) if verdict.ok else (1, None)


class _PrintAlerts:
    """A notifier that prints the alert messages the bot would post to Slack."""

    async def post(self, group: AlertGroup, *, token: str) -> Posted:
        from gpubot.core.alerting import Delivery, MessageRef, Posted

        print("[alert posted to #gpu-ops]\n" + _alert_text(group))
        return Posted(Delivery.POSTED, MessageRef(f"gpu-ops/{time.time():.6f}"))

    async def find(self, token: str, since: datetime) -> Lookup:
        """Nothing printed is ever uncertain: every post is answered at once."""
        from gpubot.core.alerting import Lookup

        return Lookup(True)

    async def update(self, where: MessageRef, group: AlertGroup) -> None:
        print("[alert updated]\n" + _alert_text(group))

    async def remind(self, where: MessageRef, group: AlertGroup) -> None:
        print("[reminder]\n" + _alert_text(group))


def _alert_text(group: AlertGroup) -> str:
    from gpubot.chat.alerts import render_alert_group
    from gpubot.console.text_render import render_text as message_text

    return message_text(render_alert_group(group))
