"""The schema (SQLAlchemy Core): one definition that runs unchanged on SQLite and PostgreSQL.

Times are UTC text of fixed width (``records.iso``) so they round-trip byte for byte on both
databases and the chain hashes recompute. The migrations in ``migrations/`` must build exactly
this; a test runs autogenerate against both databases and expects no difference.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
)

from gpubot.core.models import ApprovalState

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "pk": "pk_%(table_name)s",
}
TIME = String(27)  # 2024-01-31T12:00:00.000000Z
HASH = String(64)  # sha256 hex

metadata = MetaData(naming_convention=NAMING)

# Append-only: no code path updates or deletes a row; triggers refuse it too.
audit_log = Table(
    "audit_log",
    metadata,
    Column("seq", BigInteger, primary_key=True, autoincrement=False),
    Column("action_id", BigInteger, nullable=True),  # seq of the action's intent
    Column("kind", String(16), nullable=False),
    Column("created_at", TIME, nullable=False),
    Column("actor", Text, nullable=False),
    Column("source", Text, nullable=False),
    Column("node", Text, nullable=True),
    Column("payload", Text, nullable=False),
    Column("prev_hash", HASH, nullable=False, unique=True),  # a fork would repeat a prev_hash
    Column("hash", HASH, nullable=False, unique=True),
    Index(None, "action_id"),
    Index(None, "kind", "seq"),
    Index(None, "created_at"),
    Index(None, "node", "kind", "seq"),  # `audit list --node X`: that node's records only
)

# One row (id 1): the last record's seq and hash, updated in the append's transaction, so that
# removing records from the end of the log is noticed too.
audit_head = Table(
    "audit_head",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("seq", BigInteger, nullable=False),
    Column("hash", HASH, nullable=False),
)

_STATES = ", ".join(f"'{s.value}'" for s in ApprovalState)

approvals = Table(
    "approvals",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("requester", Text, nullable=False),
    Column("requester_name", Text, nullable=False),
    Column("source", Text, nullable=False),
    Column("node", Text, nullable=False),
    Column("plan", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("created_at", TIME, nullable=False),
    Column("expires_at", TIME, nullable=False),
    Column("decided_by", Text, nullable=True),
    Column("decided_by_name", Text, nullable=True),
    Column("decided_at", TIME, nullable=True),
    Column("finished_at", TIME, nullable=True),
    Column("result", Text, nullable=True),
    Column("taken_at", TIME, nullable=True),  # a retry took it back to approved (0013)
    Column("ref", Text, nullable=True),  # its request message, as the front end names it (0014)
    CheckConstraint(f"state IN ({_STATES})", name="state"),
    Index(None, "state"),
)

alerts = Table(
    "alerts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("key", Text, nullable=False, unique=True),  # FindingKey.text()
    Column("node", Text, nullable=False),
    Column("gpu", Integer, nullable=True),
    Column("kind", String(32), nullable=False),
    Column("holder", Text, nullable=False),
    Column("first_seen", TIME, nullable=False),
    Column("last_seen", TIME, nullable=False),
    Column("seen_count", Integer, nullable=False),
    Column("alerted_at", TIME, nullable=True),
    Column("reminded_at", TIME, nullable=True),
    Column("snoozed_until", TIME, nullable=True),
    Column("resolved_at", TIME, nullable=True),
    Column("ref", Text, nullable=True),  # its alert message (0014)
)

# The outbox (``store.outbox``). ``once`` (the subject, or NULL) makes a subject one row ever;
# ``taken_at`` is the compare-and-set of the caller that may post it now.
outbox = Table(
    "outbox",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("token", String(64), nullable=False, unique=True),
    Column("subject", Text, nullable=False),
    Column("once", Text, nullable=True, unique=True),
    Column("keys", Text, nullable=False),  # JSON list of FindingKey.text() (an alert's)
    Column("destination", Text, nullable=True),  # where it goes (NULL: the alerts channel)
    Column("since", TIME, nullable=False),  # the history is searched from here
    Column("created_at", TIME, nullable=False),
    Column("taken_at", TIME, nullable=False),
    Column("state", String(16), nullable=False),  # pending, posted, refused, abandoned
    Column("repeats", Integer, nullable=False),
    Column("ref", Text, nullable=True),
    Column("finished_at", TIME, nullable=True),
    CheckConstraint("state IN ('pending', 'posted', 'refused', 'abandoned')", name="state"),
    Index(None, "state", "subject"),
)

# One row per GPU per sweep (``core.usage.idle``): what idle detection reads; pruned after
# ``[sweep] keep_samples``. Not part of the audit chain: rows are deleted when they age out.
gpu_samples = Table(
    "gpu_samples",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("node", Text, nullable=False),
    Column("gpu_index", Integer, nullable=False),
    Column("gpu_uuid", Text, nullable=False),
    Column("taken_at", TIME, nullable=False),
    Column("utilization_pct", Integer, nullable=True),  # None: unknown (never 0)
    Column("memory_used_mib", Integer, nullable=True),
    Index(None, "taken_at"),
    Index(None, "node", "gpu_index", "taken_at"),
)

# One row per GPU (``store.idle_runs``): its latest sample's time and since when it has been
# held idle. ``min_mib``/``max_gap_ms``: the rule the run was kept under (another rule rebuilds
# it from the samples). Pruned with the samples.
gpu_idle = Table(
    "gpu_idle",
    metadata,
    Column("node", Text, nullable=False),
    Column("gpu_index", Integer, nullable=False),
    Column("gpu_uuid", Text, nullable=False),
    Column("last_at", TIME, nullable=False),
    Column("idle_since", TIME, nullable=True),  # None: not held idle at last_at
    Column("min_mib", Integer, nullable=False),
    Column("max_gap_ms", BigInteger, nullable=False),
    PrimaryKeyConstraint("node", "gpu_index", "gpu_uuid"),
    Index(None, "last_at"),
)

# Since when each process has held its GPU (``store.holder_runs``). pid 0 (no process's): the
# GPU's own looks. A holder gone from its GPU, or not looked at for longer than the gap, has no
# row.
gpu_holders = Table(
    "gpu_holders",
    metadata,
    Column("node", Text, nullable=False),
    Column("gpu_index", Integer, nullable=False),
    Column("pid", BigInteger, nullable=False),
    Column("start_ticks", BigInteger, nullable=False),
    Column("since", TIME, nullable=False),
    Column("last_at", TIME, nullable=False),
    PrimaryKeyConstraint("node", "gpu_index", "pid", "start_ticks"),
    Index(None, "last_at"),
)

# One row per exclusive thing (``reset:NODE``, ``sweep``): ``store.leases``. A row is never
# deleted, so a token is never reused. Not part of the audit chain (renewed every few seconds).
leases = Table(
    "leases",
    metadata,
    Column("resource", Text, primary_key=True),
    Column("holder", Text, nullable=False),  # "" once released
    Column("token", BigInteger, nullable=False),
    Column("since", TIME, nullable=False),  # when this holder took it
    Column("expires_at", TIME, nullable=False),
)

# Each GPU's uncorrectable ECC counts as the last sweep saw them (issue 27:
# ``core.health.findings``): a count that grows between sweeps is a finding, across restarts too.
# ``grew_from``: the count before it last grew (None: it has not); ``sweeps_since``: how many
# sweeps ago. One row per (node, GPU uuid, "volatile" | "aggregate"); a sweep upserts its own.
gpu_ecc = Table(
    "gpu_ecc",
    metadata,
    Column("node", Text, nullable=False),
    Column("gpu_uuid", Text, nullable=False),
    Column("counter", Text, nullable=False),
    Column("count", BigInteger, nullable=False),
    Column("grew_from", BigInteger, nullable=True),
    Column("sweeps_since", Integer, nullable=False),
    PrimaryKeyConstraint("node", "gpu_uuid", "counter"),
)


# GPU-hours (``core.usage.hours``, issue 26): per UTC hour, GPU and holder (``""``: the GPU's own
# figures), the milliseconds held busy, idle, unknown, claimed but unused and free, added to by
# each sweep; the report sums these, never the samples.
gpu_usage = Table(
    "gpu_usage",
    metadata,
    Column("hour", TIME, nullable=False),
    Column("node", Text, nullable=False),
    Column("gpu_index", Integer, nullable=False),
    Column("holder", Text, nullable=False),
    Column("busy_ms", BigInteger, nullable=False),
    Column("idle_ms", BigInteger, nullable=False),
    Column("unknown_ms", BigInteger, nullable=False),
    Column("unused_ms", BigInteger, nullable=False),
    Column("free_ms", BigInteger, nullable=False),
    Column("samples", BigInteger, nullable=False),
    PrimaryKeyConstraint("hour", "node", "gpu_index", "holder"),
)

# Each GPU's latest sample counted in ``gpu_usage`` (what the next one counts from).
gpu_usage_last = Table(
    "gpu_usage_last",
    metadata,
    Column("node", Text, nullable=False),
    Column("gpu_index", Integer, nullable=False),
    Column("last_at", TIME, nullable=False),
    PrimaryKeyConstraint("node", "gpu_index"),
)

# One row per sweep that counted GPU-hours, and each node's stretches without a sample longer
# than two sweep intervals (missing data, which the report names).
usage_sweeps = Table(
    "usage_sweeps",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("at", TIME, nullable=False),
    Index(None, "at"),
)
usage_gaps = Table(
    "usage_gaps",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("node", Text, nullable=False),
    Column("start_at", TIME, nullable=False),
    Column("end_at", TIME, nullable=False),
    Index(None, "end_at"),
)

# The reclaim ladder of each idle holder (``services.ladder``): the step reached and when, and
# the owner's *Keep* (who, why, when), which stops it. Every change is audited too.
idle_ladder = Table(
    "idle_ladder",
    metadata,
    Column("finding", Text, primary_key=True),  # the idle-holder finding's key text
    Column("node", Text, nullable=False),
    Column("gpu_index", Integer, nullable=False),
    Column("owner", Text, nullable=False),
    Column("step", Integer, nullable=False),  # 1 DM, 2 reminder, 3 channel post, 4 Free it
    Column("started_at", TIME, nullable=False),
    Column("step_at", TIME, nullable=False),
    Column("kept_by", Text, nullable=True),
    Column("kept_reason", Text, nullable=True),
    Column("kept_at", TIME, nullable=True),
)

# GPU claims (``store.claims``). ``holding`` is "NODE:GPU" while the claim is active and NULL
# after: a unique column, so the database itself refuses a second active claim of one GPU.
claims = Table(
    "claims",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("node", Text, nullable=False),
    Column("gpu_index", Integer, nullable=False),
    Column("gpu_uuid", Text, nullable=False),
    Column("user", Text, nullable=False),  # the Linux user
    Column("chat_id", Text, nullable=False),  # who claimed it (DMs go there)
    Column("started_at", TIME, nullable=False),
    Column("ends_at", TIME, nullable=False),
    Column("note", Text, nullable=False),
    Column("state", String(16), nullable=False),
    Column("ended_at", TIME, nullable=True),
    Column("idle_since", TIME, nullable=True),  # its GPU's idle run (core.claims.rules)
    Column("idle_last_at", TIME, nullable=True),
    Column("idle_dm_at", TIME, nullable=True),  # when its holder was asked Keep / Release
    Column("intruder_told", Text, nullable=True),  # the intruder its holder was told of
    Column("holding", Text, nullable=True, unique=True),
    CheckConstraint("state IN ('active', 'released', 'expired')", name="state"),
    Index(None, "state", "ends_at"),
    Index(None, "started_at"),
)

# The queue: one row per person waiting for GPUs of a node, first come first served by id.
claim_waits = Table(
    "claim_waits",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("node", Text, nullable=False),
    Column("gpus", Text, nullable=False),  # "2,3"; "" : any ``count``
    Column("count", Integer, nullable=False),
    Column("duration_s", Integer, nullable=True),
    Column("user", Text, nullable=False),
    Column("chat_id", Text, nullable=False),
    Column("created_at", TIME, nullable=False),
    Column("state", String(16), nullable=False),
    Column("offered", Text, nullable=False),  # the GPUs held for them: "1,2"
    Column("hold_until", TIME, nullable=True),
    CheckConstraint("state IN ('waiting', 'offered', 'taken', 'lapsed', 'left')", name="state"),
    Index(None, "state", "node"),
)

# Maintenance windows (``store.maint``, issue 37): a node's planned work from ``starts_at`` to
# ``ends_at``; ``ended_at`` when ``maint end`` closed it early. Every change is audited too.
maint_windows = Table(
    "maint_windows",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("node", Text, nullable=False),
    Column("starts_at", TIME, nullable=False),
    Column("ends_at", TIME, nullable=False),
    Column("reason", Text, nullable=False),
    Column("opened_by", Text, nullable=False),
    Column("created_at", TIME, nullable=False),
    Column("ended_at", TIME, nullable=True),
    Column("ended_by", Text, nullable=True),
    Index(None, "ends_at"),
)

# Direct messages handed over (``store.dm_due``, issue 39): rendered by a process whose front end
# does not reach the person, kept until the process whose front end does has posted them.
dm_due = Table(
    "dm_due",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("subject", Text, nullable=False, unique=True),  # its outbox subject
    Column("chat_id", Text, nullable=False),
    Column("body", Text, nullable=False),  # JSON (``chat.message_codec``)
    Column("created_at", TIME, nullable=False),
)
