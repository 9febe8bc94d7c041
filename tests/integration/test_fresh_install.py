"""A fresh install speaks only of itself: no library's warning before gpubot's own output.

Each check runs a new interpreter, so no module is already imported by the test session and
every import's warnings fire again; ``-W error`` turns any that gpubot lets through into a
failure. The one exception gpubot makes (cryptography's DSA deprecation, raised from asyncssh's
modules) lives where gpubot imports asyncssh, not here: this test lists none.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _modules(package: str, under: Path = ROOT) -> list[str]:
    """Every module of ``package`` (a folder of ``under``), dotted, sorted."""
    base = under / package
    names = []
    for path in sorted(base.rglob("*.py")):
        if path.name == "__main__.py":  # runs the program when imported: `--help` covers it
            continue
        parts = path.relative_to(under).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _clean_env(tmp_path: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)}


def test_every_module_imports_under_w_error(tmp_path: Path) -> None:
    modules = _modules("gpubot") + _modules("gpusim", ROOT / "sim")
    assert len(modules) > 100 and {"gpubot.transport.ssh", "gpusim.fleet"} <= set(modules)
    # One interpreter importing all of them still sees each library's first import, which is
    # when libraries warn.
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    p = subprocess.run(
        [sys.executable, "-W", "error", "-c", code, *modules],
        cwd=tmp_path,
        env=_clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stderr == ""


def test_the_import_fails_without_the_filter(tmp_path: Path) -> None:
    """Control: asyncssh imported bare under ``-W error`` raises, with today's cryptography.

    Should a future cryptography drop the warning (or asyncssh stop naming DSA), this control
    fails and says that the filter in ``gpubot/transport/sshlib.py`` can go.
    """
    p = subprocess.run(
        [sys.executable, "-W", "error", "-c", "import asyncssh"],
        cwd=tmp_path,
        env=_clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode != 0 and "DSA is deprecated" in p.stderr, p.stderr[-2000:]


def test_help_writes_nothing_to_stderr(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "gpubot", "--help"],
        cwd=tmp_path,
        env=_clean_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0 and "usage" in p.stdout
    assert p.stderr == ""
