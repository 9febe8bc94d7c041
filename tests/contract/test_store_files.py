"""Files gpubot writes hold other users' command lines: the SQLite database, its ``-wal`` and
``-shm`` files, and ``audit export --output`` are ``0600`` whatever the umask. A new SQLite
database sets itself up on first use."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpubot.cli import main
from gpubot.store import open_store
from gpubot.store.version import HEAD


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The most permissive umask: every file mode below is gpubot's own doing."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


async def _record(url: str) -> None:
    store = open_store(url)
    try:
        await store.record_query(
            kind="status", actor="cli:alice", source="cli", nodes=["n1"], failed={}, seconds=0.1
        )
        db = Path(url.removeprefix("sqlite:///"))
        files = [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]
        assert all(f.exists() for f in files)  # WAL mode, while the store is open
        assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}
        assert store.revision() == (HEAD, HEAD)  # created and migrated on first use
        assert (await store.verify()).checked == 1
    finally:
        store.close()


def test_a_new_sqlite_database_sets_itself_up_and_is_private(
    tmp_path: Path, open_umask: None
) -> None:
    asyncio.run(_record(f"sqlite:///{tmp_path / 'new.db'}"))
    assert mode(tmp_path / "new.db") == 0o600


def test_an_empty_file_is_a_new_database(tmp_path: Path, open_umask: None) -> None:
    (tmp_path / "touched.db").touch(mode=0o600)
    asyncio.run(_record(f"sqlite:///{tmp_path / 'touched.db'}"))


def test_a_database_others_can_read_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "old.db"
    open_store(f"sqlite:///{db}").close()
    db.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="gpubot.store.engine"):
        open_store(f"sqlite:///{db}").close()
    assert f"{db} is readable by other users (mode 0644)" in caplog.text
    assert f"chmod 600 {db}" in caplog.text
    assert mode(db) == 0o644  # an existing file's mode is the administrator's to change


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_an_export_file_is_private(
    tmp_path: Path, open_umask: None, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    asyncio.run(_record(url))
    cfg = tmp_path / "gpubot.toml"
    cfg.write_text(f'[database]\nurl = "{url}"\n', encoding="utf-8")
    new, old = tmp_path / "new.export", tmp_path / "old.export"
    old.write_text("someone else's text, long enough to be longer than the export " * 50)
    old.chmod(0o644)
    for path in (new, old):
        code = main(["--config", str(cfg), "audit", "export", "--format", fmt, "-o", str(path)])
        out, err = capsys.readouterr()
        assert (code, out, err) == (0, "", "")
        assert mode(path) == 0o600
        text = path.read_text()
        if fmt == "jsonl":
            assert [json.loads(line)["seq"] for line in text.splitlines()] == [1]
        else:
            assert text.splitlines()[0].startswith("seq,action_id,kind")
            assert len(text.splitlines()) == 2


def test_an_export_that_cannot_be_written_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    cfg = tmp_path / "gpubot.toml"
    cfg.write_text(f'[database]\nurl = "{url}"\n', encoding="utf-8")
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    for target in (tmp_path / "missing" / "x.jsonl", tmp_path, tmp_path / "link"):
        code = main(["--config", str(cfg), "audit", "export", "-o", str(target)])
        out, err = capsys.readouterr()
        assert (code, out) == (2, "") and err.count("\n") == 1
        assert err.startswith(f"gpubot: error: --output: cannot write {target}: ")
    assert not (tmp_path / "elsewhere").exists()  # a symbolic link is not followed
