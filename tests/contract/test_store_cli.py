"""``gpubot audit`` and ``gpubot db`` against SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpubot.cli import main
from gpubot.cli.audit import parse_since
from gpubot.errors import UsageError
from gpubot.store import open_store
from gpubot.store.chain import walk
from gpubot.store.records import AuditRecord
from gpubot.store.version import HEAD
from tests.fixtures.db import not_in_memory, tamper

REPO = Path(__file__).resolve().parents[2]


def _settings(tmp_path: Path, url: str) -> str:
    path = tmp_path / "gpubot.toml"
    path.write_text(f'[database]\nurl = "{url}"\n', encoding="utf-8")
    return str(path)


def _cli(capsys: pytest.CaptureFixture[str], config: str, *argv: str) -> tuple[int, str, str]:
    code = main(["--config", config, *argv])
    out, err = capsys.readouterr()
    return code, out, err


async def _populate(url: str) -> list[int]:
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
        await store.record_event(a, {"type": "signal", "pid": 4242, "signal": "SIGTERM"})
        await store.finish_action(a, status="ok", result={"1": "freed"})
        b = await store.begin_action(
            kind="gpu-reset",
            actor="cli:root",
            source="cli",
            command="gpubot gpu-reset node4 0",
            node="node4",
            gpus=[0],
            plan=None,
        )
        await store.record_query(
            kind="status",
            actor="U2 (bob)",
            source="slack",
            nodes=["a", "b"],
            failed={"b": "timed out"},
            seconds=0.5,
        )
        return [a, b]
    finally:
        store.close()


def test_db_upgrade_current_and_downgrade(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, empty_db_url: str, db_kind: str
) -> None:
    cfg = _settings(tmp_path, empty_db_url)
    code, out, _ = _cli(capsys, cfg, "db", "current")
    assert code == 0 and "base (empty)" in out and "run `gpubot db upgrade`" in out
    code, out, err = _cli(capsys, cfg, "audit", "list")
    if db_kind == "postgresql":
        assert code == 2 and out == ""
        assert err.count("\n") == 1 and "run `gpubot db upgrade`" in err
        code, out, _ = _cli(capsys, cfg, "db", "upgrade")
        assert code == 0 and out.rstrip().endswith(f"base -> {HEAD}")
    else:  # a new SQLite database sets itself up on first use
        assert (code, out, err) == (0, "no actions match\n", "")
    code, out, _ = _cli(capsys, cfg, "db", "upgrade")
    assert code == 0 and f"already at {HEAD}" in out
    code, out, _ = _cli(capsys, cfg, "db", "current")
    assert code == 0 and f"at {HEAD} (what this gpubot needs)" in out
    code, out, err = _cli(capsys, cfg, "db", "downgrade", "nope")
    assert code == 2 and err.count("\n") == 1 and "cannot downgrade to 'nope'" in err
    code, out, _ = _cli(capsys, cfg, "db", "downgrade", "base")
    assert code == 0 and f"{HEAD} -> base" in out


def test_audit_list_filters_and_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fresh_db_url: str
) -> None:
    a, b = asyncio.run(_populate(fresh_db_url))
    cfg = _settings(tmp_path, fresh_db_url)
    code, out, _ = _cli(capsys, cfg, "audit", "list")
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:3] == ["ID", "STARTED", "(UTC)"]
    assert [ln.split()[0] for ln in lines[1:]] == [str(b), str(a)]
    assert "incomplete" in lines[1] and "/gpu reset node3 1" in lines[2]

    code, out, _ = _cli(capsys, cfg, "audit", "list", "--json", "--node", "node3")
    [row] = json.loads(out)
    assert (row["id"], row["status"], row["gpus"], row["actor"]) == (a, "ok", [1], "U1 (alice)")
    code, out, _ = _cli(capsys, cfg, "audit", "list", "--json", "--actor", "cli:")
    assert [r["id"] for r in json.loads(out)] == [b]
    code, out, _ = _cli(capsys, cfg, "audit", "list", "--json", "--since", "2h", "--limit", "1")
    assert [r["id"] for r in json.loads(out)] == [b]
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    code, out, _ = _cli(capsys, cfg, "audit", "list", "--since", future)
    assert (code, out) == (0, "no actions match\n")
    code, out, _ = _cli(capsys, cfg, "audit", "list", "--queries", "--json")
    [q] = json.loads(out)
    assert q["payload"] == {
        "query": "status",
        "nodes": ["a", "b"],
        "failed": {"b": "timed out"},
        "seconds": 0.5,
    }


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["list", "--since", "yesterday"], "bad --since 'yesterday': expected a duration"),
        (["list", "--limit", "0"], "--limit: expected a whole number > 0"),
        (["list", "--queries", "--node", "n1"], "--node does not apply"),
        (["show", "abc"], "ID: expected a whole number"),
        (["show", "999"], "there is no action 999"),
        (["export", "--format", "xml"], "--format: expected jsonl or csv"),
    ],
)
def test_bad_input_is_one_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    store_url: str,
    argv: list[str],
    words: str,
) -> None:
    code, out, err = _cli(capsys, _settings(tmp_path, store_url), "audit", *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and words in err and "Traceback" not in err


def test_audit_show(capsys: pytest.CaptureFixture[str], tmp_path: Path, fresh_db_url: str) -> None:
    a, _ = asyncio.run(_populate(fresh_db_url))
    cfg = _settings(tmp_path, fresh_db_url)
    code, out, _ = _cli(capsys, cfg, "audit", "show", str(a))
    assert code == 0
    assert out.startswith(f"action {a}: reset on node3 GPUs 1: ok\n")
    assert "U1 (alice) via slack:#gpu" in out and '"signal":"SIGTERM"' in out
    assert '"1": "freed"' in out
    code, out, _ = _cli(capsys, cfg, "audit", "show", str(a), "--json")
    d = json.loads(out)
    assert (d["plan"], d["result"], d["records"]) == ({"pids": [4242]}, {"1": "freed"}, [1, 2, 3])
    assert d["events"][0]["signal"] == "SIGTERM" and d["events"][0]["at"].endswith("Z")


def test_audit_export_holds_the_whole_chain(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fresh_db_url: str
) -> None:
    asyncio.run(_populate(fresh_db_url))
    cfg = _settings(tmp_path, fresh_db_url)
    code, out, _ = _cli(capsys, cfg, "audit", "export")
    records = [AuditRecord(**json.loads(line)) for line in out.splitlines()]
    assert code == 0 and [r.seq for r in records] == [1, 2, 3, 4, 5]
    # The export alone is enough to check the chain somewhere else.
    by_hash = {r.hash: r.seq for r in records}
    assert walk(records, (5, records[-1].hash), by_hash.get).ok
    code, out, _ = _cli(capsys, cfg, "audit", "export", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["hash"] for r in rows] == [r.hash for r in records]
    assert rows[3]["action_id"] == "4" and rows[4]["action_id"] == ""


def test_audit_verify_exit_status(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fresh_db_url: str
) -> None:
    asyncio.run(_populate(fresh_db_url))
    cfg = _settings(tmp_path, fresh_db_url)
    code, out, _ = _cli(capsys, cfg, "audit", "verify")
    assert code == 0 and out.startswith("audit log intact: 5 records, head ")
    tamper(fresh_db_url, "UPDATE audit_log SET actor = 'U9' WHERE seq = 2")
    code, out, err = _cli(capsys, cfg, "audit", "verify")
    assert (code, out) == (1, "")
    assert (
        err == "gpubot: audit log tampered: record 2 was edited: its content does not match "
        "its hash (1 records intact before it)\n"
    )


def test_the_installed_entry_point_verifies(
    tmp_path: Path, fresh_db_url: str, db_kind: str
) -> None:
    not_in_memory(db_kind, "lives in one process: this is another")
    asyncio.run(_populate(fresh_db_url))
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "GPUBOT_CONFIG": _settings(tmp_path, fresh_db_url),
    }
    done = subprocess.run(
        [sys.executable, "-m", "gpubot", "audit", "verify"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert "5 records" in done.stdout


NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2h", NOW - timedelta(hours=2)),
        ("30m", NOW - timedelta(minutes=30)),
        ("7d", NOW - timedelta(days=7)),
        ("1w", NOW - timedelta(weeks=1)),
        ("90s", NOW - timedelta(seconds=90)),
        ("2029-12-31T08:00", datetime(2029, 12, 31, 8, 0, tzinfo=UTC)),
        ("2029-12-31T08:00:00+02:00", datetime(2029, 12, 31, 6, 0, tzinfo=UTC)),
        ("2029-12-31", datetime(2029, 12, 31, tzinfo=UTC)),
    ],
)
def test_since_accepts_durations_and_iso_times(text: str, expected: datetime) -> None:
    assert parse_since(text, NOW) == expected


@pytest.mark.parametrize("text", ["", "2", "h", "-2h", "2 hours", "2029-13-01", "soon"])
def test_since_refuses_anything_else(text: str) -> None:
    with pytest.raises(UsageError, match="--since"):
        parse_since(text, NOW)
