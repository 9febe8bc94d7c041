"""``gpubot audit list --kind`` and ``audit show`` of any record, on every database: a claim
and an approval are listed and shown, not only resets; ``--since 1h30m`` works."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpubot.cli import main
from gpubot.core.claims.rules import ClaimRequest, Granted
from gpubot.store import open_store
from tests.fixtures.approvals import REQUEST


def _settings(tmp_path: Path, url: str) -> str:
    path = tmp_path / "gpubot.toml"
    path.write_text(f'[database]\nurl = "{url}"\n', encoding="utf-8")
    return str(path)


def _cli(capsys: pytest.CaptureFixture[str], config: str, *argv: str) -> tuple[int, str, str]:
    code = main(["--config", config, *argv])
    out, err = capsys.readouterr()
    return code, out, err


async def _populate(url: str) -> dict[str, int]:
    """A reset, a claim (through the claims store the service writes with), an approval."""
    store = open_store(url)
    try:
        reset = await store.begin_action(
            kind="reset",
            actor="U1",
            source="slack",
            command="/gpu reset node1 gpu 2",
            node="node1",
            gpus=[2],
            plan=None,
        )
        await store.finish_action(reset, status="ok", result={})
        now = time.time()
        claim = ClaimRequest(
            node="node1",
            gpus=((2, "GPU-0002"),),
            user="bob",
            chat_id="U2",
            start=now,
            end=now + 5400,
            note="train-lr",
            source="cli",
        )
        assert isinstance(await store.claims.claim(claim), Granted)
        approval = await store.approvals.create("U1", "alice", "node3", REQUEST)
        await store.approvals.decide(approval.id, "U4", True, datetime.now(UTC))
        records = await store.records()
        return {
            "reset": reset,
            "claim": max(r.seq for r in records if r.kind == "claim"),
            "approved": max(r.seq for r in records if r.kind == "approval"),
        }
    finally:
        store.close()


def test_list_kinds_since_and_show_a_claim(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fresh_db_url: str
) -> None:
    ids = asyncio.run(_populate(fresh_db_url))
    cfg = _settings(tmp_path, fresh_db_url)

    code, out, err = _cli(capsys, cfg, "audit", "list", "--since", "1h30m")
    assert (code, err) == (0, "")
    listed = [ln.split()[0] for ln in out.splitlines()[1:]]
    assert str(ids["claim"]) in listed and str(ids["reset"]) in listed  # the people default

    code, out, _ = _cli(capsys, cfg, "audit", "list", "--kind", "claim", "--json")
    rows = json.loads(out)
    assert code == 0 and [r["id"] for r in rows] == [ids["claim"]]
    assert (rows[0]["kind"], rows[0]["status"], rows[0]["actor"]) == ("claim", "claimed", "U2")
    assert (rows[0]["node"], rows[0]["gpus"]) == ("node1", [2])

    code, out, _ = _cli(capsys, cfg, "audit", "list", "--kind", "claim")
    assert code == 0 and "claimed" in out and "/gpu reset" not in out

    code, out, _ = _cli(capsys, cfg, "audit", "list", "--kind", "approval", "--node", "node3")
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:4] == ["ID", "STARTED", "(UTC)", "KIND"]
    assert any(ln.split()[0] == str(ids["approved"]) and "approved" in ln for ln in lines)
    assert all(" approval " in ln for ln in lines[1:])

    code, out, _ = _cli(capsys, cfg, "audit", "list", "--kind", "reset,claim", "--json")
    assert [r["id"] for r in json.loads(out)] == [ids["claim"], ids["reset"]]

    code, out, _ = _cli(capsys, cfg, "audit", "show", str(ids["claim"]))
    assert code == 0 and out.startswith(f"record {ids['claim']}: claim (claimed) on node1\n")
    assert "who:      U2 via cli" in out and '"note": "train-lr"' in out and "hash:" in out
    code, out, _ = _cli(capsys, cfg, "audit", "show", str(ids["claim"]), "--json")
    shown = json.loads(out)
    assert (shown["seq"], shown["payload"]["change"]) == (ids["claim"], "claimed")
    code, out, _ = _cli(capsys, cfg, "audit", "show", str(ids["reset"]))
    assert code == 0 and out.startswith(f"action {ids['reset']}: reset on node1")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["list", "--kind", "claims"], "--kind: unknown kind 'claims'; valid kinds: action, reset"),
        (["list", "--kind", "claim", "--queries"], "--kind does not apply to --queries"),
        (["list", "--since", "1h1h"], "bad --since '1h1h': expected a duration like"),
        (["show", "999"], "there is no action 999 in the audit log, nor a record 999"),
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
    assert (code, out) == (2, "") and err.count("\n") == 1 and words in err, err
