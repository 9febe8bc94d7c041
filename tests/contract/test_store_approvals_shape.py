"""A stored approval's JSON keeps its shape: rows written before the request was typed load as
``ApprovalRequest`` values, on SQLite and PostgreSQL, and an unreadable row is one clear error."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from gpubot.core.approval.model import ApprovalRequest
from gpubot.core.models import ApprovalState as S
from gpubot.core.reset.plan import ResetPlan
from gpubot.core.slurm.drain import NodeChange
from gpubot.errors import StoreError
from gpubot.store import Store
from gpubot.store.records import iso
from gpubot.store.tables import approvals
from tests.fixtures.approvals import REQUEST

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)

# Verbatim: what ``ApprovalService.open`` stored before the request was typed, i.e.
# ``{**plan.to_dict(), "grace_s": ..., "command": ..., "requester_user": ...}``.
OLD_ROW = """{"command":"/gpu reset node3 gpu 1 --force","expected_after_mib":{"1":0},"forced":true,
"gpus":[1],"grace_s":5.0,"memory_before_mib":{"1":500},"node":"node3","requester":"alice",
"requester_user":"alice","skipped":[],"targets":[{"also_on":[],"command":"python train.py",
"forced":true,"gpus":[1],"mib":500,"owner":"bob","pid":4242,"ppid":null,"reasons":
["holds GPU memory"],"start_ticks":77,"state":null,"uid":1001,"user":"bob","workload":null}]}"""


def _insert(store: Store, plan_json: str) -> int:
    with store.engine.begin() as conn:
        res = conn.execute(
            approvals.insert().values(
                requester="U1",
                requester_name="alice",
                source="slack",
                node="node3",
                plan=plan_json,
                state=S.PENDING.value,
                created_at=iso(T0),
                expires_at=iso(T0 + timedelta(minutes=15)),
            )
        )
        assert res.inserted_primary_key is not None
        return int(res.inserted_primary_key[0])


def _stored(store: Store, aid: int) -> Any:
    with store.engine.connect() as conn:
        text = conn.execute(select(approvals.c.plan).where(approvals.c.id == aid)).scalar_one()
    return json.loads(text)


async def test_a_row_of_the_old_shape_loads_as_the_typed_request(store: Store) -> None:
    aid = _insert(store, OLD_ROW)
    a = await store.approvals.get(aid)
    assert a is not None and a.request == REQUEST
    assert isinstance(a.plan, ResetPlan) and a.request.change is None  # a reset, as ever
    assert (a.plan.forced, a.plan.targets[0].pid, a.request.node) == (True, 4242, "node3")


async def test_a_new_row_is_stored_in_the_old_shape(store: Store) -> None:
    a = await store.approvals.create("U1", "alice", "node3", REQUEST, now=T0)
    assert _stored(store, a.id) == json.loads(OLD_ROW)


async def test_a_row_from_before_the_options_existed_loads_with_their_defaults(
    store: Store,
) -> None:
    old = json.loads(OLD_ROW)
    for key in ("grace_s", "command", "requester_user"):
        del old[key]
    a = await store.approvals.get(_insert(store, json.dumps(old)))
    assert a is not None and a.request.plan == REQUEST.plan
    assert (a.request.command, a.request.grace_s, a.request.requester_user) == ("", None, None)


DRAIN = ApprovalRequest(
    NodeChange("node3", True, "xid 79 on GPU 5"),
    command="/gpu drain node3 because xid 79 on GPU 5",
    requester_user="alice",
)
# What a node change's request is stored as: the change under its own key, so that a row
# without that key is a reset plan.
DRAIN_ROW = {
    "node_change": {"node": "node3", "state": "DRAIN", "reason": "xid 79 on GPU 5"},
    "command": "/gpu drain node3 because xid 79 on GPU 5",
    "grace_s": None,
    "requester_user": "alice",
}


@pytest.mark.parametrize(
    ("request_", "row"),
    [
        (DRAIN, DRAIN_ROW),
        (
            ApprovalRequest(NodeChange("node3", False), command="resume node3"),
            {
                "node_change": {"node": "node3", "state": "RESUME", "reason": None},
                "command": "resume node3",
                "grace_s": None,
                "requester_user": None,
            },
        ),
    ],
)
async def test_a_node_change_is_stored_under_its_key_and_read_back(
    store: Store, request_: ApprovalRequest, row: dict[str, Any]
) -> None:
    a = await store.approvals.create("U1", "alice", "node3", request_, now=T0)
    assert _stored(store, a.id) == row
    got = await store.approvals.get(a.id)
    assert got is not None and got.request == request_ and got.request.change == request_.plan
    assert got.node == "node3"


@pytest.mark.parametrize(
    "bad",
    [
        '{"node": "node3", "kill": [{"pid": 4242}]}',
        "[1, 2]",
        '{"node": "node3"}',
        '{"node_change": {"node": "node3", "state": "DOWN"}}',
        '{"node_change": {"state": "DRAIN"}}',
        '{"node_change": "node3"}',
        '{"node_change": {"node": "node3", "state": "DRAIN", "reason": 7}}',
    ],
)
async def test_an_unreadable_row_is_one_clear_error(store: Store, bad: str) -> None:
    aid = _insert(store, bad)
    with pytest.raises(StoreError, match=rf"^approval {aid}: its stored plan cannot be read"):
        await store.approvals.get(aid)
