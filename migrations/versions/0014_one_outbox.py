"""One outbox for every post that must appear once, and one message reference per message.

``alert_posts``, ``approval_posts`` and ``usage_digests`` become ``outbox``: every row moves,
since a refused or given-up row still marks its subject done. Each message's (channel, ts)
becomes one ``ref``, in ``outbox``, ``alerts`` and ``approvals``. The rows were written by the
Slack front end, so the refs are written as it writes them (``CHANNEL/TS``).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-12
"""

from __future__ import annotations

import hashlib
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

STATES = (
    "'pending', 'approved', 'denied', 'expired', 'cancelled', 'executed', 'failed', "
    "'incomplete', 'waiting'"
)  # as 0011 left them
POST_STATES = "state IN ('pending', 'posted', 'refused', 'abandoned')"
NO_KEYS = "[]"


def _time(name: str, nullable: bool = False) -> sa.Column[str]:
    return sa.Column(name, sa.String(27), nullable=nullable)


def _text(name: str, nullable: bool = True) -> sa.Column[str]:
    return sa.Column(name, sa.Text(), nullable=nullable)


def _where(old: bool) -> list[sa.Column[Any]]:
    """The columns naming a message: (channel, message_ts) before, one ref after."""
    return [_text("channel"), _text("message_ts")] if old else [_text("ref")]


def _approvals(old: bool) -> sa.Table:
    """Return the approvals table before (``old``) or after this revision."""
    return sa.Table(
        "approvals",
        sa.MetaData(),
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        _text("requester", False),
        _text("requester_name", False),
        _text("source", False),
        _text("node", False),
        _text("plan", False),
        sa.Column("state", sa.String(16), nullable=False),
        _time("created_at"),
        _time("expires_at"),
        _text("decided_by"),
        _text("decided_by_name"),
        _time("decided_at", nullable=True),
        _time("finished_at", nullable=True),
        _text("result"),
        *(_where(old) if old else []),
        _time("taken_at", nullable=True),
        *([] if old else _where(old)),
        sa.CheckConstraint(f"state IN ({STATES})", name="ck_approvals_state"),
        sa.PrimaryKeyConstraint("id", name="pk_approvals"),
        sa.Index("ix_approvals_state", "state"),
    )


def _alerts(old: bool) -> sa.Table:
    """Return the alerts table before (``old``) or after this revision."""
    return sa.Table(
        "alerts",
        sa.MetaData(),
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        _text("key", False),
        _text("node", False),
        sa.Column("gpu", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(32), nullable=False),
        _text("holder", False),
        _time("first_seen"),
        _time("last_seen"),
        sa.Column("seen_count", sa.Integer(), nullable=False),
        _time("alerted_at", nullable=True),
        *(_where(old) if old else []),
        _time("reminded_at", nullable=True),
        _time("snoozed_until", nullable=True),
        _time("resolved_at", nullable=True),
        *([] if old else _where(old)),
        sa.PrimaryKeyConstraint("id", name="pk_alerts"),
        sa.UniqueConstraint("key", name="uq_alerts_key"),
    )


def _posts(name: str, approval: bool) -> sa.Table:
    """Return ``alert_posts`` or ``approval_posts`` as 0004 and 0007 made them."""
    token = sa.Column("token", sa.String(64), nullable=False)
    if approval:
        aid = sa.Column("approval_id", sa.Integer(), nullable=False)
        purpose = sa.Column("purpose", sa.String(16), nullable=False)
        cols = [aid, purpose, token, _text("channel", False), _text("thread_ts")]
    else:
        cols = [token, _text("node", False), _text("keys", False), _time("since")]
    cols.append(_time("created_at"))
    return sa.Table(
        name,
        sa.MetaData(),
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        *cols,
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("repeats", sa.Integer(), nullable=False),
        *([] if approval else [_text("channel")]),
        _text("message_ts"),
        _time("finished_at", nullable=True),
        sa.CheckConstraint(POST_STATES, name=f"ck_{name}_state"),
        sa.PrimaryKeyConstraint("id", name=f"pk_{name}"),
        sa.UniqueConstraint("token", name=f"uq_{name}_token"),
        *(
            [sa.UniqueConstraint("approval_id", "purpose", name=f"uq_{name}_approval_id_purpose")]
            if approval
            else []
        ),
        sa.Index(f"ix_{name}_state", "state"),
    )


def _digests() -> sa.Table:
    """Return ``usage_digests`` as 0009 made it."""
    return sa.Table(
        "usage_digests",
        sa.MetaData(),
        _text("period", False),
        _text("token", False),
        _text("state", False),
        _time("created_at"),
        _text("channel"),
        _text("message_ts"),
        sa.PrimaryKeyConstraint("period", name="pk_usage_digests"),
    )


def _outbox() -> sa.Table:
    return sa.Table(
        "outbox",
        sa.MetaData(),
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("token", sa.String(64), nullable=False),
        _text("subject", False),
        _text("once"),
        _text("keys", False),
        _text("destination"),
        _time("since"),
        _time("created_at"),
        _time("taken_at"),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("repeats", sa.Integer(), nullable=False),
        _text("ref"),
        _time("finished_at", nullable=True),
        sa.CheckConstraint(POST_STATES, name="ck_outbox_state"),
        sa.PrimaryKeyConstraint("id", name="pk_outbox"),
        sa.UniqueConstraint("token", name="uq_outbox_token"),
        sa.UniqueConstraint("once", name="uq_outbox_once"),
        sa.Index("ix_outbox_state_subject", "state", "subject"),
    )


def _ref(channel: str | None, ts: str | None) -> str | None:
    return None if channel is None or ts is None else f"{channel}/{ts}"


def _split(ref: str | None) -> tuple[str | None, str | None]:
    if ref is None:
        return None, None
    channel, _, ts = ref.partition("/")
    return channel, ts or None


def _once_token(subject: str) -> str:
    """The token 0004's rows gave a message due once (one row per subject)."""
    return hashlib.sha256(subject.encode()).hexdigest()[:32]


def _alert_row(r: Any) -> dict[str, Any]:
    message = r.keys == NO_KEYS
    once = r.node if message and r.token == _once_token(r.node) else None
    return {
        "subject": r.node if message else f"alert:{r.node}",
        "once": once,
        "keys": r.keys,
        "destination": None,
        "since": r.since,
        "ref": _ref(r.channel, r.message_ts),
    }


def _approval_row(r: Any, channel: str | None) -> dict[str, Any]:
    subject = f"approval:{r.approval_id}:{r.purpose}"
    return {
        "subject": subject,
        "once": subject,
        "keys": NO_KEYS,
        "destination": _ref(r.channel, r.thread_ts) or r.channel,
        "since": r.created_at,
        "ref": _ref(channel, r.message_ts),
    }


def _move_posts_in(conn: sa.Connection) -> None:
    outbox = _outbox()
    alert_posts, approval_posts = _posts("alert_posts", False), _posts("approval_posts", True)
    rows: list[tuple[int, dict[str, Any]]] = []
    for r in conn.execute(sa.select(alert_posts).order_by(alert_posts.c.id)):
        rows.append((0, _alert_row(r) | _common(r)))
    for r in conn.execute(sa.select(approval_posts).order_by(approval_posts.c.id)):
        rows.append((1, _approval_row(r, r.channel) | _common(r)))
    digests = _digests()
    for r in conn.execute(sa.select(digests).order_by(digests.c.period)):
        once = {"subject": r.period, "once": r.period, "keys": NO_KEYS, "destination": None}
        when = {"since": r.created_at, "created_at": r.created_at, "taken_at": r.created_at}
        rest = {"state": r.state, "repeats": 0, "finished_at": None}
        ref = {"token": r.token, "ref": _ref(r.channel, r.message_ts)}
        rows.append((2, once | when | rest | ref))
    rows.sort(key=lambda row: (row[1]["created_at"], row[0]))
    if rows:
        conn.execute(outbox.insert(), [row for _, row in rows])


def _common(r: Any) -> dict[str, Any]:
    return {
        "token": r.token,
        "created_at": r.created_at,
        "taken_at": r.created_at,
        "state": r.state,
        "repeats": r.repeats,
        "finished_at": r.finished_at,
    }


def _move_posts_out(conn: sa.Connection) -> None:
    outbox = _outbox()
    alert_posts, approval_posts = _posts("alert_posts", False), _posts("approval_posts", True)
    digests = _digests()
    for r in conn.execute(sa.select(outbox).order_by(outbox.c.id)).all():
        channel, ts = _split(r.ref)
        common = _common(r) | {"message_ts": ts}
        if r.subject.startswith("digest:") and r.once == r.subject:
            state = "refused" if r.state == "abandoned" else r.state
            values = {"channel": channel, "message_ts": ts, "created_at": r.created_at}
            conn.execute(
                digests.insert().values(period=r.subject, token=r.token, state=state, **values)
            )
            continue
        if r.subject.startswith("approval:"):
            _, aid, purpose = r.subject.split(":", 2)
            to, thread = _split(r.destination)
            conn.execute(
                approval_posts.insert().values(
                    approval_id=int(aid),
                    purpose=purpose,
                    channel=to or "",
                    thread_ts=thread,
                    **{k: v for k, v in common.items() if k != "taken_at"},
                )
            )
            continue
        node = r.subject.removeprefix("alert:") if r.keys != NO_KEYS else r.subject
        if r.once is not None:  # 0013's code finds a once-only row by this token alone
            common["token"] = _once_token(r.subject)
        conn.execute(
            alert_posts.insert().values(
                node=node,
                keys=r.keys,
                since=r.since,
                channel=channel,
                **{k: v for k, v in common.items() if k != "taken_at"},
            )
        )


def _recreate(table: sa.Table, old: bool) -> None:
    """Replace ``table``'s two message columns by ``ref`` (``old``: the other way round)."""
    name = table.name
    conn = op.get_bind()
    if old:
        op.add_column(name, sa.Column("channel", sa.Text(), nullable=True))
        op.add_column(name, sa.Column("message_ts", sa.Text(), nullable=True))
        t = sa.table(name, sa.column("id"), sa.column("ref"))
        full = sa.table(name, sa.column("id"), sa.column("channel"), sa.column("message_ts"))
        for r in conn.execute(sa.select(t).where(t.c.ref.is_not(None))).all():
            channel, ts = _split(r.ref)
            conn.execute(
                full.update().where(full.c.id == r.id).values(channel=channel, message_ts=ts)
            )
        drop = ["ref"]
    else:
        op.add_column(name, sa.Column("ref", sa.Text(), nullable=True))
        op.execute(
            f"UPDATE {name} SET ref = channel || '/' || message_ts "
            "WHERE channel IS NOT NULL AND message_ts IS NOT NULL"
        )
        drop = ["channel", "message_ts"]
    if conn.dialect.name == "sqlite":
        # Copy the table from its full definition: a reflected copy could lose the CHECK.
        with op.batch_alter_table(name, copy_from=table, recreate="always") as batch:
            for col in drop:
                batch.drop_column(col)
        return
    for col in drop:
        op.drop_column(name, col)


def upgrade() -> None:
    """Create ``outbox``, move both outboxes' rows into it, drop them; one ref per message."""
    outbox = _outbox()
    outbox.create(op.get_bind())
    _move_posts_in(op.get_bind())
    for name in ("alert_posts", "approval_posts"):
        op.drop_index(f"ix_{name}_state", table_name=name)
        op.drop_table(name)
    op.drop_table("usage_digests")
    _recreate(_with_ref_last(_alerts(old=True)), old=False)
    _recreate(_with_ref_last(_approvals(old=True)), old=False)


def _with_ref_last(table: sa.Table) -> sa.Table:
    """Return ``table`` (as it was) with ``ref`` added last, as ``add_column`` leaves it."""
    table.append_column(_text("ref"))
    return table


def downgrade() -> None:
    """Put back the three outboxes (with every row) and the two columns."""
    conn = op.get_bind()
    for name, approval in (("alert_posts", False), ("approval_posts", True)):
        _posts(name, approval).create(conn)
    _digests().create(conn)
    _move_posts_out(conn)
    op.drop_index("ix_outbox_state_subject", table_name="outbox")
    op.drop_table("outbox")
    _recreate(_with_both_last(_alerts(old=False)), old=True)
    _recreate(_with_both_last(_approvals(old=False)), old=True)


def _with_both_last(table: sa.Table) -> sa.Table:
    """Return ``table`` (after this revision) with the two columns added last."""
    table.append_column(_text("channel"))
    table.append_column(_text("message_ts"))
    return table
