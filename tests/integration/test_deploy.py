"""Deployment files: the compose file validates, and a built wheel carries everything it needs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_compose_file_is_accepted(tmp_path: Path) -> None:
    compose = shutil.which("docker-compose")
    assert compose, "docker-compose (Debian package) is needed for this check; .ci/run installs it"
    shutil.copy(ROOT / "docker-compose.yml", tmp_path / "docker-compose.yml")
    shutil.copy(ROOT / "Dockerfile", tmp_path / "Dockerfile")
    shutil.copy(ROOT / "deploy" / "env.example", tmp_path / ".env")
    shutil.copy(ROOT / "gpubot.example.toml", tmp_path / "gpubot.toml")
    p = subprocess.run([compose, "config"], cwd=tmp_path, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "gpubot db upgrade && exec gpubot serve" in p.stdout
    assert "/etc/gpubot/gpubot.toml:ro" in p.stdout


def test_wheel_ships_the_migrations(tmp_path: Path) -> None:
    """Build the wheel the image installs, install it alone, run `db upgrade` from elsewhere."""
    dist, target = tmp_path / "dist", tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("gpubot-*.whl")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    # -I: no checkout on sys.path; the wheel's own code goes first, before this venv's packages.
    prelude = f"import sys; sys.path[:0] = [{str(target)!r}]; "
    cfg = tmp_path / "gpubot.toml"
    cfg.write_text(f'[database]\nurl = "sqlite:///{tmp_path}/a.db"\n')
    for args in (["db", "upgrade"], ["audit", "verify"]):
        code = prelude + "from gpubot.cli import main; sys.exit(main())"
        p = subprocess.run(
            [sys.executable, "-I", "-c", code, "--config", str(cfg), *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )
        assert p.returncode == 0, p.stderr
    code = (
        prelude
        + "import gpubot, gpubot_migrations; print(gpubot.__file__, gpubot_migrations.__file__)"
    )
    p = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True)
    assert p.returncode == 0 and all(f.startswith(str(target)) for f in p.stdout.split()), p.stdout
