"""A PostgreSQL URL on an install without the ``postgres`` extra: one line that names it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# What Python says when a package is not installed, for psycopg only: a finder ahead of the
# real ones (psycopg is installed here, with the test extra).
NO_PSYCOPG = """
import sys
class Missing:
    def find_spec(self, name, path=None, target=None):
        if name == "psycopg" or name.startswith("psycopg."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
if sys.argv.pop(1) == "missing":
    sys.meta_path.insert(0, Missing())
from gpubot.cli import main
sys.exit(main())
"""
URL = "postgresql://gpubot@127.0.0.1:1/gpubot"  # port 1: nothing listens


def gpubot(tmp_path: Path, driver: str, *args: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "gpubot.toml"
    config.write_text(f'[database]\nurl = "{URL}"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUBOT_")}
    return subprocess.run(
        [sys.executable, "-c", NO_PSYCOPG, driver, "--config", str(config), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )


@pytest.mark.parametrize("command", [("db", "upgrade"), ("audit", "verify")], ids=" ".join)
def test_a_missing_driver_names_the_extra(tmp_path: Path, command: tuple[str, ...]) -> None:
    p = gpubot(tmp_path, "missing", *command)
    assert (p.returncode, p.stderr.splitlines()) == (
        2,
        [
            "gpubot: error: cannot use postgresql+psycopg://gpubot@127.0.0.1:1/gpubot: "
            "its driver (psycopg) is not installed: pip install 'gpubot[postgres]'"
        ],
    )


def test_control_with_the_driver_it_gets_as_far_as_connecting(tmp_path: Path) -> None:
    p = gpubot(tmp_path, "installed", "db", "upgrade")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "gpubot[postgres]" not in p.stderr and "127.0.0.1" in p.stderr, p.stderr
