"""Sweep records stay small at 1,000 nodes; old and new records list and verify alike."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from gpubot.cli import main
from gpubot.store import open_store
from gpubot.store.query_records import node_count, nodes_digest, query_payload
from tests.fixtures.db import audit_rows

NODES = [f"node{i}" for i in range(1, 1001)]


async def _write(url: str) -> None:
    store = open_store(url)
    try:
        # 0005's shape: every node named
        await store.record_query(
            kind="sweep", actor="gpubot:a", source="schedule", nodes=NODES, failed={}, seconds=9.5
        )
        # this shape: counted; what failed and changed named
        changed = {"added": ["node1001"], "removed": [], "recovered": ["node7"]}
        await store.record_query(
            kind="sweep",
            actor="gpubot:a",
            source="schedule",
            nodes=[*NODES, "node1001"],
            failed={"node42": "timed out"},
            seconds=9.75,
            changed=changed,
        )
    finally:
        store.close()


def test_a_sweep_record_of_1000_nodes_is_under_a_kilobyte(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fresh_db_url: str
) -> None:
    asyncio.run(_write(fresh_db_url))
    old, new = audit_rows(fresh_db_url)[-2:]
    assert len(old.payload) > 9_000  # what every sweep wrote before
    assert len(new.payload) <= 1024, len(new.payload)
    assert json.loads(new.payload) == {
        "query": "sweep",
        "node_count": 1001,
        "nodes_digest": nodes_digest([*NODES, "node1001"]),
        "failed": {"node42": "timed out"},
        "seconds": 9.75,
        "added": ["node1001"],
        "recovered": ["node7"],
    }
    cfg = tmp_path / "gpubot.toml"
    cfg.write_text(f'[database]\nurl = "{fresh_db_url}"\n', encoding="utf-8")
    assert main(["--config", str(cfg), "audit", "verify"]) == 0
    capsys.readouterr()
    assert main(["--config", str(cfg), "audit", "list", "--queries"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "NODES" in lines[0]
    new_row, old_row = lines[1].split(), lines[2].split()  # newest first
    assert "1001" in new_row and "node42" in new_row, new_row
    assert "1000" in old_row, old_row


def test_the_digest_names_the_list_not_its_order() -> None:
    assert nodes_digest(["b", "a"]) == nodes_digest(["a", "b"]) != nodes_digest(["a", "c"])
    assert node_count(query_payload("sweep", ["a", "b"], {}, 1.0, None)) == 2
    assert node_count(query_payload("sweep", ["a", "b"], {}, 1.0, {})) == 2
    with pytest.raises(ValueError, match="unknown node changes"):
        query_payload("sweep", ["a"], {}, 1.0, {"renamed": ["a"]})
