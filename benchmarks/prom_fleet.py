"""A real Prometheus holding a big fleet's dcgm-exporter series, for ``benchmarks.prom_summary``.

The series are a recorded dcgm-exporter text's (``tests/corpus/dcgm/cncf-upcloud-l40s.prom``,
one L40S: every metric family of it, labels and values as recorded) repeated for each GPU of
each node, the ``Hostname``, ``UUID``, ``gpu``, ``device`` and ``pci_bus_id`` labels varied and
the memory and utilisation values spread, so every GPU is a series of its own. They are written
once to a file that ``python -m http.server`` (a process of its own: its CPU is not gpubot's)
serves as one exporter path carrying every node's series; Prometheus (Debian's 2.42, our child
on 127.0.0.1, its TSDB in the work folder) scrapes it with ``honor_labels``, so each series keeps
its own ``Hostname``.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import CLK_TCK, REPO

SAMPLE = REPO / "tests" / "corpus" / "dcgm" / "cncf-upcloud-l40s.prom"
PROMETHEUS = "/usr/bin/prometheus"
_SERIES = re.compile(r"^(?P<name>[A-Za-z_:][\w:]*)\{(?P<labels>.*)\} (?P<value>\S+)$")
VARIED = ("gpu", "UUID", "pci_bus_id", "device", "Hostname")


def families(text: str) -> list[tuple[list[str], str, dict[str, str], str]]:
    """The sample's families: (their ``#`` lines, the metric, its other labels, its value)."""
    out: list[tuple[list[str], str, dict[str, str], str]] = []
    head: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            head.append(line)
            continue
        m = _SERIES.match(line)
        if m is None:
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m["labels"]))
        out.append(
            (head, m["name"], {k: v for k, v in labels.items() if k not in VARIED}, m["value"])
        )
        head = []
    return out


def value(metric: str, recorded: str, node: int, gpu: int) -> str:
    """The memory and utilisation spread over the fleet (some GPUs idle, some full); the rest as
    recorded. Used + free + reserved stays the recorded total."""
    total = 45459 + 608  # the L40S's free + reserved as recorded, nothing used
    used = 0 if (node + gpu) % 3 == 0 else (node * 7919 + gpu * 104729) % (total - 608)
    if metric == "DCGM_FI_DEV_FB_USED":
        return str(used)
    if metric == "DCGM_FI_DEV_FB_FREE":
        return str(total - 608 - used)
    if metric == "DCGM_FI_DEV_GPU_UTIL":
        return "0" if used == 0 else str((node * 31 + gpu * 17) % 101)
    return recorded


def node_name(i: int) -> str:
    return f"node{i}"  # the SSH fleet's names (``benchmarks.status_floor.bot``)


def exposition(nodes: int, gpus: int) -> bytes:
    """The text of one exporter path carrying ``nodes`` × ``gpus`` GPUs' series, each family's
    series together after its ``# HELP``/``# TYPE`` (as the text format asks)."""
    out: list[str] = []
    for head, metric, labels, recorded in families(SAMPLE.read_text(encoding="utf-8")):
        out.extend(head)
        rest = "".join(f',{k}="{v}"' for k, v in labels.items())
        for n in range(1, nodes + 1):
            host = node_name(n)
            for g in range(gpus):
                uuid = f"GPU-{n:08x}-{g:04x}-4340-039d-25f2a83cdc43"
                out.append(
                    f'{metric}{{gpu="{g}",UUID="{uuid}",pci_bus_id="00000000:{g + 1:02x}:00.0",'
                    f'device="nvidia{g}"{rest},Hostname="{host}"}} {value(metric, recorded, n, g)}'
                )
    return ("\n".join(out) + "\n").encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def config(exporter_port: int, interval_s: int) -> str:
    """prometheus.yml (JSON is YAML): one job, one path carrying every node's series."""
    job = {
        "job_name": "dcgm",
        "honor_labels": True,  # each series keeps its own Hostname (and any instance it has)
        "metrics_path": "/metrics.txt",
        "scrape_interval": f"{interval_s}s",
        "scrape_timeout": f"{interval_s}s",
        "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}],
    }
    return json.dumps({"scrape_configs": [job]}, indent=1)


@dataclass
class Running:
    """A Prometheus scraping the fleet's exporter path."""

    url: str
    pid: int
    series: int
    interval_s: int

    def query(self, promql: str) -> list[dict[str, Any]]:
        q = urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{q}", timeout=60) as resp:
            result: list[dict[str, Any]] = json.loads(resp.read())["data"]["result"]
        return result

    def cpu_s(self) -> float:
        """Prometheus's own CPU so far (user + system)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def between_scrapes(self, need_s: float) -> float:
        """Wait until no scrape runs for the next ``need_s`` seconds; return the wait. Here
        Prometheus shares the bot's cores, and a scrape of 460,000 series is seconds of its CPU;
        deployed, it has its own."""
        s = self.scrape()
        busy = s["duration_s"] + 1.0
        wait = 0.0
        if s["age_s"] < busy:  # one is running
            wait = busy - s["age_s"]
        elif self.interval_s - s["age_s"] < need_s:  # the next starts too soon
            wait = self.interval_s - s["age_s"] + busy
        time.sleep(max(0.0, wait))
        return wait

    def scrape(self) -> dict[str, float]:
        """The last scrape's duration, its samples, and its age (s)."""
        up = self.query('timestamp(up{job="dcgm"})')
        took = self.query('scrape_duration_seconds{job="dcgm"}')
        n = self.query('scrape_samples_scraped{job="dcgm"}')
        age = time.time() - float(up[0]["value"][1]) if up else float("inf")
        return {
            "duration_s": float(took[0]["value"][1]) if took else float("nan"),
            "samples": float(n[0]["value"][1]) if n else 0.0,
            "age_s": age,
        }


def _wait(what: str, ok: Any, proc: subprocess.Popen[bytes], log: Path, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while True:
        try:
            if ok():
                return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise SystemExit(f"{what}: not ready within {limit_s:g} s\n{tail}")
        time.sleep(0.5)


@contextmanager
def prometheus(work: Path, nodes: int, gpus: int, interval_s: int) -> Iterator[Running]:
    """Write the exposition, serve it, start Prometheus, wait for its first full scrape."""
    text = exposition(nodes, gpus)
    site = work / "site"
    site.mkdir()
    (site / "metrics.txt").write_bytes(text)
    series = text.count(b"\n") - text.count(b"\n#") - int(text.startswith(b"#"))
    eport, pport = free_port(), free_port()
    (work / "prometheus.yml").write_text(config(eport, interval_s))
    http_log, prom_log = work / "http.log", work / "prometheus.log"
    exporter = subprocess.Popen(
        ["python3", "-m", "http.server", str(eport), "--bind", "127.0.0.1"],
        cwd=site,
        stdout=subprocess.DEVNULL,
        stderr=http_log.open("wb"),
    )
    argv = [
        PROMETHEUS,
        f"--config.file={work / 'prometheus.yml'}",
        f"--storage.tsdb.path={work / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{pport}",
        "--storage.tsdb.retention.time=1d",
        "--log.level=warn",
    ]
    env = {"PATH": "/usr/bin:/bin", "GOMAXPROCS": str(os.cpu_count() or 1)}
    prom = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=prom_log.open("wb"))
    run = Running(f"http://127.0.0.1:{pport}", prom.pid, series, interval_s)
    try:
        ready = urllib.request.Request(f"{run.url}/-/ready")
        _wait("prometheus", lambda: urllib.request.urlopen(ready, timeout=2), prom, prom_log, 120)

        def scraped() -> bool:
            return run.scrape()["samples"] >= series

        _wait(f"prometheus scraping {series} series", scraped, prom, prom_log, 60 + 4 * interval_s)
        yield run
    finally:
        for p in (prom, exporter):
            p.terminate()
        for p in (prom, exporter):
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
