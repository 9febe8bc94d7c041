"""``gpubot db downgrade`` as a person runs it (a real process on a SQLite file): it refuses to
drop audit, approval or claim records without ``--yes`` (or a y on a terminal) and, for audit
records, ``--i-have-a-copy`` naming an export of this very log that it checks; the log is intact
after every refusal. Controls: the same command goes through with a real export, and an empty
database goes with ``--yes`` alone, so each refusal is the guard's, not a broken command's.
"""

from __future__ import annotations

import asyncio
import os
import pty
import re
import select
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpubot.store import open_store
from gpubot.store.version import HEAD
from tests.fixtures.approvals import REQUEST
from tests.fixtures.db import audit_rows, migrated_sqlite

# A test here runs up to eight gpubot processes one after another (each bounded at 90 s below);
# on a loaded 2-core box each took up to 15 s, so the default 120 s can end a test that works.
pytestmark = pytest.mark.timeout(360)


def gpubot(
    config: Path, *args: str, stdin: int = subprocess.DEVNULL
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m gpubot --config CONFIG ARGS`` with no terminal (stdin: /dev/null)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GPUBOT_CONFIG", "GPUBOT_AUDIT_KEY")}
    return subprocess.run(
        [sys.executable, "-m", "gpubot", "--config", str(config), *args],
        stdin=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
    )


def database(folder: Path, *, records: bool) -> tuple[Path, str]:
    """Return the settings file of a migrated SQLite database (with a reset action and an
    approval when ``records``) and the database's URL."""
    folder.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{folder / 'gpubot.db'}"
    config = folder / "gpubot.toml"
    config.write_text(f'[database]\nurl = "{url}"\n', encoding="utf-8")
    migrated_sqlite(folder / "gpubot.db")  # what `gpubot db upgrade` makes, without a process
    if records:
        asyncio.run(_populate(url))
    return config, url


async def _populate(url: str) -> None:
    store = open_store(url)
    try:
        a = await store.begin_action(
            kind="reset",
            actor="U1 (alice)",
            source="slack:#gpu",
            command="/gpu reset node3 1",
            node="node3",
            gpus=[1],
            plan={"pids": [4242]},
        )
        await store.finish_action(a, status="ok", result={"1": "freed"})
        await store.approvals.create("U1", "alice", "node3", REQUEST, 900)
    finally:
        store.close()


def intact(config: Path, url: str, records: int) -> None:
    """Assert the schema is still at head and the audit log holds ``records``, verified."""
    assert f"at {HEAD} (what this gpubot needs)" in gpubot(config, "db", "current").stdout
    assert len(audit_rows(url)) == records
    p = gpubot(config, "audit", "verify")
    assert p.returncode == 0 and f"{records} records" in p.stdout, p.stderr


def refused(p: subprocess.CompletedProcess[str], *words: str) -> None:
    """Assert ``p`` was refused in one line (exit 2) that says ``words``."""
    assert (p.returncode, p.stdout) == (2, ""), p
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr, p.stderr
    for w in words:
        assert w in p.stderr, p.stderr


def export(config: Path, path: Path, fmt: str = "jsonl") -> Path:
    """Write a real ``gpubot audit export`` of the log at ``path``."""
    p = gpubot(config, "audit", "export", "--format", fmt, "-o", str(path))
    assert p.returncode == 0, p.stderr
    return path


def dropped(config: Path) -> bool:
    """Whether the database is now empty (downgraded to base)."""
    return "base (empty)" in gpubot(config, "db", "current").stdout


def test_no_terminal_no_yes_is_refused_and_the_log_stays(tmp_path: Path) -> None:
    config, url = database(tmp_path, records=True)
    n = len(audit_rows(url))
    assert n >= 2
    p = gpubot(config, "db", "downgrade", "base")
    refused(p, f"would drop {n} audit records, 1 approval", "--yes", "--i-have-a-copy")
    intact(config, url, n)
    # --yes alone is not enough while audit records would go.
    refused(gpubot(config, "db", "downgrade", "base", "--yes"), "--i-have-a-copy", "audit export")
    intact(config, url, n)
    # A copy but no --yes, and no terminal to ask on.
    copy = export(config, tmp_path / "audit.jsonl")
    p = gpubot(config, "db", "downgrade", "base", "--i-have-a-copy", str(copy))
    refused(p, "--yes (no terminal")
    intact(config, url, n)
    # Control: the same downgrade with both goes through.
    p = gpubot(config, "db", "downgrade", "base", "--yes", "--i-have-a-copy", str(copy))
    assert p.returncode == 0 and f"{HEAD} -> base" in p.stdout, p.stderr
    assert dropped(config)


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_a_real_export_of_this_log_lets_it_through(tmp_path: Path, fmt: str) -> None:
    config, _url = database(tmp_path, records=True)
    copy = export(config, tmp_path / f"audit.{fmt}", fmt)
    p = gpubot(config, "db", "downgrade", "base", "--yes", "--i-have-a-copy", str(copy))
    assert (p.returncode, p.stderr) == (0, "") and f"{HEAD} -> base" in p.stdout
    assert dropped(config)


def _short(lines: list[str]) -> list[str]:
    return lines[:-1]


def _edited(lines: list[str]) -> list[str]:
    return [ln.replace('\\"freed\\"', '\\"FREED\\"') for ln in lines]


def _reordered(lines: list[str]) -> list[str]:
    return [lines[1], lines[0], *lines[2:]]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (_short, "export it again"),
        (_edited, "was edited"),
        (_reordered, "does not follow"),
        (lambda _lines: ["not an export\n"], "line 1 is not a record"),
        (lambda _lines: [], "holds 0 of the log's"),
    ],
)
def test_a_short_or_tampered_copy_is_refused(
    tmp_path: Path, change: Callable[[list[str]], list[str]], words: str
) -> None:
    config, url = database(tmp_path, records=True)
    n = len(audit_rows(url))
    lines = export(config, tmp_path / "audit.jsonl").read_text(encoding="utf-8").splitlines(True)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(change(lines)), encoding="utf-8")
    p = gpubot(config, "db", "downgrade", "base", "--yes", "--i-have-a-copy", str(bad))
    refused(p, "--i-have-a-copy", words)
    intact(config, url, n)


def test_an_export_of_another_log_is_refused(tmp_path: Path) -> None:
    config, url = database(tmp_path / "one", records=True)
    other, _ = database(tmp_path / "two", records=True)  # the same actions, other times
    copy = export(other, tmp_path / "other.jsonl")
    p = gpubot(config, "db", "downgrade", "base", "--yes", "--i-have-a-copy", str(copy))
    refused(p, "not a copy of this log")
    intact(config, url, len(audit_rows(url)))


def test_an_empty_database_goes_with_yes_alone(tmp_path: Path) -> None:
    config, url = database(tmp_path, records=False)
    assert audit_rows(url) == []
    p = gpubot(config, "db", "downgrade", "base", "--yes")
    assert (p.returncode, p.stderr) == (0, "") and f"{HEAD} -> base" in p.stdout
    assert dropped(config)


def test_a_downgrade_that_keeps_the_protected_tables_is_not_asked(tmp_path: Path) -> None:
    """0009 drops the claim tables only: with no claim held, audit records do not stop it."""
    config, url = database(tmp_path, records=True)
    p = gpubot(config, "db", "downgrade", "0009")
    assert (p.returncode, p.stderr) == (0, "") and f"{HEAD} -> 0009" in p.stdout
    assert len(audit_rows(url)) >= 2


def on_a_terminal(config: Path, answer: str, *args: str) -> tuple[int, str]:
    """Run ``gpubot db downgrade ARGS`` with a terminal for stdin, answer its question once;
    return its exit status and all it wrote (question included)."""
    main, sub = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("GPUBOT_CONFIG", "GPUBOT_AUDIT_KEY")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpubot", "--config", str(config), "db", "downgrade", *args],
        stdin=sub,
        stdout=sub,
        stderr=sub,
        env=env,
    )
    os.close(sub)
    seen, deadline, answered = b"", time.monotonic() + 60, False
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 1)
            if ready:
                try:
                    chunk = os.read(main, 4096)
                except OSError:  # the process ended and closed the terminal
                    break
                if not chunk:
                    break
                seen += chunk
            if not answered and b"[y/N]" in seen:
                os.write(main, answer.encode() + b"\n")
                answered = True
        return proc.wait(timeout=30), seen.decode(errors="replace")
    finally:
        os.close(main)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("answer", ["", "n", "no", "sure"])
def test_on_a_terminal_anything_but_yes_refuses(tmp_path: Path, answer: str) -> None:
    config, url = database(tmp_path, records=True)
    n = len(audit_rows(url))
    copy = export(config, tmp_path / "audit.jsonl")
    code, text = on_a_terminal(config, answer, "base", "--i-have-a-copy", str(copy))
    question = re.search(r"downgrade .* to base, dropping (.*)\? \[y/N\]", text)
    assert question and question[1] == f"{n} audit records, 1 approval", text
    assert code == 2 and "cancelled; nothing was dropped" in text
    intact(config, url, n)


@pytest.mark.parametrize("answer", ["y", "YES"])
def test_on_a_terminal_yes_goes_through(tmp_path: Path, answer: str) -> None:
    config, _url = database(tmp_path, records=True)
    copy = export(config, tmp_path / "audit.jsonl")
    code, text = on_a_terminal(config, answer, "base", "--i-have-a-copy", str(copy))
    assert code == 0 and f"{HEAD} -> base" in text, text
    assert dropped(config)
