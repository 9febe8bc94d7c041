"""The fast schema check's HEAD is Alembic's head."""

from __future__ import annotations

import subprocess
import sys

from gpubot.store import migrate, version


def test_head_constant_matches_the_migrations() -> None:
    assert migrate.head() == version.HEAD


def test_opening_the_store_does_not_import_alembic() -> None:
    code = "import sys, gpubot.app, gpubot.store; print('alembic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
