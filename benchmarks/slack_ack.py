"""Slack acknowledgement under a burst: N concurrent signed ``/gpu status all`` requests.

``gpubot serve --http`` runs as a real process over the simulated fleet, with its Web API
pointed at the loopback fake of Slack from ``benchmarks/fake_slack.py``. The benchmark sends a
burst at once (each request on its own connection, signed like Slack) and times each HTTP 200:
that is the acknowledgement Slack waits at most 3 s for. Every request then starts a fleet
status in the bot. Then as many requests again arrive one every ``spacing_s`` while that fleet
work runs (users who keep asking), each timed the same way: their acks sample the bot's
responsiveness across the busy period rather than at one instant. Afterwards it waits
(bounded) for all the answers and reports how many arrived and when the last one did, and
scrapes the bot's metrics (``--metrics-port``) for the longest time its event loop was held
(``gpubot_event_loop_max_stall_seconds``, since it began serving) and how many of its watch's
wake-ups came over 50 ms late: an ack waits behind such a stall.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from benchmarks.common import PYTHON, REPO, percentile
from benchmarks.fake_slack import BOT_TOKEN, SECRET, FakeSlack, SlackSender
from gpusim.fleet import SimFleet


@dataclass
class AckResult:
    """What one burst measured (``busy``: the second burst, sent while the first one's work ran)."""

    label: str
    requests: int
    acks: list[float] = field(default_factory=list)  # seconds to each HTTP 200
    bad: list[str] = field(default_factory=list)  # non-200 answers
    answered: int = 0  # final status messages posted within the wait (both bursts)
    last_answer_s: float | None = None  # from the first burst's start to the last answer
    busy_acks: list[float] = field(default_factory=list)
    busy_bad: list[str] = field(default_factory=list)
    busy_after_s: float = 0.0  # spacing of the second wave's requests
    calls: dict[str, int] = field(default_factory=dict)  # Web API / response_url calls made
    max_stall_s: float | None = None  # the bot's longest event-loop stall (its metrics)
    stalls_over_50ms: int | None = None  # the loop watch's wake-ups more than 50 ms late

    @property
    def p50(self) -> float | None:
        """Median acknowledgement time."""
        return percentile(self.acks, 50) if self.acks else None

    @property
    def p99(self) -> float | None:
        """99th percentile (nearest rank) of the acknowledgement times."""
        return percentile(self.acks, 99) if self.acks else None

    @property
    def busy_p50(self) -> float | None:
        """Median acknowledgement time of the second burst."""
        return percentile(self.busy_acks, 50) if self.busy_acks else None

    @property
    def busy_p99(self) -> float | None:
        """99th percentile of the second burst's acknowledgement times."""
        return percentile(self.busy_acks, 99) if self.busy_acks else None


def write_config(fleet: SimFleet, work: Path) -> Path:
    """Write the fleet's settings with a migrated audit database and a Slack channel."""
    db = f"sqlite:///{work}/slack-audit.db"
    text = fleet.config_path.read_text(encoding="utf-8")
    start = text.index('url = "', text.index("[database]"))
    end = text.index("\n", start)
    text = text[:start] + f'url = "{db}"' + text[end:]
    text += '\n[slack]\nchannel = "C0GENERAL"\n'
    path = work / "slack-gpubot.toml"
    path.write_text(text, encoding="utf-8")
    up = subprocess.run(
        [PYTHON, "-m", "gpubot", "--config", str(path), "db", "upgrade"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if up.returncode != 0:
        raise RuntimeError(f"gpubot db upgrade failed: {up.stderr.strip()}")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _wait_healthy(port: int, proc: asyncio.subprocess.Process, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                raise RuntimeError(f"gpubot serve exited with {proc.returncode}")
            try:
                async with s.get(f"http://127.0.0.1:{port}/healthz") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("gpubot serve did not start listening")


STALL_METRIC = "gpubot_event_loop_max_stall_seconds"
STALL_BUCKET = 'gpubot_event_loop_stall_seconds_bucket{le="0.05"}'
STALL_COUNT = "gpubot_event_loop_stall_seconds_count"


def parse_stalls(text: str) -> tuple[float | None, int | None]:
    """Return the longest loop stall (s) and the wake-ups over 50 ms late from a scrape."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in (STALL_METRIC, STALL_BUCKET, STALL_COUNT):
            values[name] = float(value)
    late = None
    if STALL_BUCKET in values and STALL_COUNT in values:
        late = int(values[STALL_COUNT] - values[STALL_BUCKET])
    return values.get(STALL_METRIC), late


async def scrape_stalls(port: int) -> tuple[float | None, int | None]:
    """Scrape the bot's metrics; (None, None) if they cannot be read."""
    try:
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
            return parse_stalls(await r.text())
    except aiohttp.ClientError:
        return None, None


def _finals(fake: FakeSlack) -> list[float]:
    """Return when each request got its final answer (not the "⏳ asking" placeholder).

    The bot posts a placeholder and then updates it (``chat.update`` of that message's ``ts``)
    or answers on the request's own ``response_url`` (``response:cmdN``): the first final
    answer per message or per URL counts.
    """
    first: dict[str, float] = {}
    for call in fake.calls:
        if not call.method.startswith(("response:", "chat.")):
            continue
        body = call.body
        text = str(body.get("text", "")) + json.dumps(body.get("blocks", ""), ensure_ascii=False)
        if "⏳" not in text:
            if call.method.startswith("response:"):
                key = call.method
            elif call.method == "chat.update":
                key = f"update:{body.get('channel')}:{body.get('ts')}"
            else:
                key = f"{call.method}:{id(call)}"
            first.setdefault(key, call.at)
    return sorted(first.values())


async def _send_burst(
    sender: SlackSender, requests: int, tag: str
) -> tuple[list[float], list[str]]:
    """Send ``requests`` signed ``/gpu status all`` at once; return ack times and failures."""
    bodies = [sender.command_body("status all", user=f"U0{tag}{i:04d}") for i in range(requests)]
    replies = await asyncio.gather(
        *(sender.send(b, "application/x-www-form-urlencoded") for b in bodies),
        return_exceptions=True,
    )
    acks, bad = [], []
    for r in replies:
        if isinstance(r, BaseException):
            bad.append(repr(r)[:200])
        elif r.status != 200:
            bad.append(f"HTTP {r.status}: {r.text[:100]}")
        else:
            acks.append(r.seconds)
    return acks, bad


async def burst(
    config: Path,
    requests: int,
    wait_s: float,
    experiment: str = "",
    label: str = "gpubot",
    spacing_s: float = 0.1,
) -> AckResult:
    """Start ``gpubot serve --http``; send a burst, and another while its work runs; time acks."""
    fake = FakeSlack()
    await fake.start()
    port, metrics_port = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "GPUBOT_"))}
    env.update(SLACK_BOT_TOKEN=BOT_TOKEN, SLACK_SIGNING_SECRET=SECRET, SLACK_API_URL=fake.base_url)
    head = (
        [PYTHON, "-m", "benchmarks.experiments", experiment, "--"]
        if experiment
        else [PYTHON, "-m", "gpubot"]
    )
    proc = await asyncio.create_subprocess_exec(
        *head,
        "--config",
        str(config),
        "serve",
        "--http",
        "--port",
        str(port),
        "--metrics-port",
        str(metrics_port),
        "--metrics-host",
        "127.0.0.1",
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    result = AckResult(label, requests)
    try:
        await _wait_healthy(port, proc, 60)
        sender = SlackSender(f"http://127.0.0.1:{port}/slack/events", SECRET, fake)
        started = time.monotonic()
        result.acks, result.bad = await _send_burst(sender, requests, "A")
        # The first burst's fleet work runs now: more requests arrive, one every spacing_s.
        result.busy_after_s = spacing_s
        waves = []
        for i in range(requests):
            waves.append(asyncio.create_task(_send_burst(sender, 1, f"B{i:03d}")))
            await asyncio.sleep(spacing_s)
        for acks, bad in await asyncio.gather(*waves):
            result.busy_acks += acks
            result.busy_bad += bad
        left = started + wait_s - time.monotonic()
        with contextlib.suppress(AssertionError):  # not all answered in time: counted below
            await fake.wait_for(lambda: len(_finals(fake)) >= 2 * requests, timeout=max(0.1, left))
        finals = _finals(fake)
        result.answered = len(finals)
        result.calls = dict(collections.Counter(c.method.split(":")[0] for c in fake.calls))
        result.last_answer_s = max(finals) - started if finals else None
        result.max_stall_s, result.stalls_over_50ms = await scrape_stalls(metrics_port)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)  # our own child, by pid
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        await fake.stop()
    return result


def main(argv: list[str]) -> int:
    """Run one burst against an existing config: ``CONFIG REQUESTS [EXPERIMENT]``."""
    res = asyncio.run(burst(Path(argv[0]), int(argv[1]), 120, argv[2] if len(argv) > 2 else ""))
    print(json.dumps(res.__dict__))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
