"""``gpubot demo`` as a newcomer runs it: a subprocess with a clean environment."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from gpubot.cli.audit import parse_head
from tests.procs import cmdlines


def test_demo_walks_through_and_leaves_nothing(tmp_path: Path) -> None:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
    }
    p = subprocess.run(
        [sys.executable, "-m", "gpubot", "demo"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    out = p.stdout
    # The README's first command: nothing but gpubot's own output, no library's warning first.
    assert p.stderr == "", p.stderr[-2000:]
    for words in (
        "1 node(s) did not answer",  # the unreachable node
        "orphaned GPU memory",  # the sweep's finding ...
        "node unreachable",
        "✅ freed",  # the self-service reset of the stubborn process
        "Waiting for an on-call approver",  # the forced kill ...
        "Approved by @U0OLGA",  # ... approved, then run
        "GPU reset node3 · GPU 2 · freed",  # the leaked VRAM freed by --gpu-reset
        "audit log intact",
    ):
        assert words in out, words
    # The story's people own its jobs (as root: uids only the simulated fleet names).
    if os.geteuid() == 0:
        for who, mib in (("bob", 61440), ("alice", 30720), ("dana", 40960)):
            assert re.search(rf"(?m)^ +\d+ +{mib} / \d+ .* {who} \d+ {mib} MiB ", out), who
        assert "signalled: dana " in out and "signalled: bob " in out
        assert "This kills processes of `bob`" in out
        assert not re.search(r"\b(root|nobody) \d+ \d+ MiB", out)
    # The head it prints is what --expect-head takes: the demo ran that check and it held.
    heads = re.findall(r"head (\d+):([0-9a-f]{64}), ", out)
    assert heads and len(set(heads)) == 1, out[-800:]
    seq, digest = heads[0]
    assert parse_head(f"{seq}:{digest}") == (int(seq), digest)
    assert f"audit verify --expect-head {seq}:{digest}" in out
    assert out.rstrip().endswith(f"holds {seq}:{digest}"), out[-400:]
    # Every simulated process lives under the fleet's folder: none may outlive the demo.
    folders = set(re.findall(r"/tmp/gpusim-[A-Za-z0-9_]+", out))
    assert folders, "the demo's fleet folder should appear in its tables"
    leftovers = {pid: c for pid, c in cmdlines().items() if any(f in c for f in folders)}
    assert not leftovers, leftovers
    assert not any(Path(f).exists() for f in folders)
    assert list(tmp_path.iterdir()) == [] or all(x.name.startswith(".") for x in tmp_path.iterdir())
