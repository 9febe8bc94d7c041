"""A gpubot that does not serve (``gpubot report``, ``audit``, ``console``…) imports no metrics:
``prometheus_client`` costs every such command its start-up time, and only ``serve`` exposes
metrics. Each build runs in a fresh interpreter, since a module once imported stays imported."""

from __future__ import annotations

import json
import subprocess
import sys

# Builds the app as the warm commands do (``serving``: as ``gpubot serve``), then prints whether
# the metrics were imported.
BUILD = """
import json, sys
from gpubot.app import Serving, build
from gpubot.config import parse
node = {"name": "n1", "host": "127.0.0.1", "port": 9}
settings = parse({"database": {"url": "memory://"}, "nodes": [node]}, "gpubot.toml")
serving = Serving(settle_heap=False) if sys.argv[1] == "serve" else None
build(settings, {}, need_store=False, serving=serving)
print(json.dumps([m in sys.modules for m in ("prometheus_client", "gpubot.metrics")]))
"""


def _imports_metrics(how: str) -> list[bool]:
    p = subprocess.run(
        [sys.executable, "-c", BUILD, how], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    got: list[bool] = json.loads(p.stdout)
    return got


def test_a_gpubot_that_does_not_serve_imports_no_metrics() -> None:
    assert _imports_metrics("warm") == [False, False]


def test_control_a_serving_gpubot_imports_them() -> None:
    assert _imports_metrics("serve") == [True, True]
