"""Every gpubot and gpusim package ships: pyproject lists them by hand (migrations/ is renamed)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_subpackage_is_listed() -> None:
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for top in ("gpubot", "gpusim")
        for p in (ROOT / top).rglob("__init__.py")
    }
    assert found <= listed, f"add to pyproject [tool.setuptools] packages: {sorted(found - listed)}"
    assert {"gpusim", "gpubot_migrations", "gpubot_migrations.versions"} <= listed
