"""Value types the store hands out (standard library only, so any layer may read them)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from gpubot.core import durations
from gpubot.core.approval.model import Approval as Approval  # defined in core: services read it
from gpubot.core.timefmt import iso as _iso

# Fixed width, so that text order is time order on every database.
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def iso(moment: datetime) -> str:
    """Render an aware datetime as the store's UTC text (microseconds, fixed width)."""
    if moment.tzinfo is None:
        raise ValueError("naive datetime: pass an aware one, e.g. datetime.now(UTC)")
    return _iso(moment, timespec="microseconds")  # isoformat pads years before 1000 too


def parse_iso(text: str) -> datetime:
    return datetime.strptime(text, TIME_FORMAT).replace(tzinfo=UTC)


def parse_opt(text: str | None) -> datetime | None:
    return None if text is None else parse_iso(text)


def text_of(unix: float) -> str:
    return iso(datetime.fromtimestamp(unix, UTC))


def unix_of(text: str) -> float:
    """Return the unix time of the store's UTC text (``fromisoformat``: fast, the same value)."""
    return datetime.fromisoformat(text).timestamp()


@dataclass(frozen=True)
class AuditRecord:
    """One append-only record of the hash chain, exactly as stored."""

    seq: int
    action_id: int | None
    kind: str  # intent | event | outcome | query | approval | alert
    created_at: str  # UTC text, see ``iso``
    actor: str
    source: str
    node: str | None
    payload: str  # canonical JSON text
    prev_hash: str
    hash: str

    @property
    def time(self) -> datetime:
        return parse_iso(self.created_at)

    @property
    def data(self) -> Any:
        return json.loads(self.payload)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ActionSummary:
    """An action's intent and, once written, its outcome status."""

    id: int
    kind: str  # what was done: reset, gpu-reset, ...
    actor: str
    source: str
    command: str
    node: str | None
    gpus: tuple[int, ...]
    started_at: datetime
    status: str  # an ActionStatus (INCOMPLETE while no outcome is written) or an older word
    finished_at: datetime | None

    @property
    def incomplete(self) -> bool:
        """Whether no outcome was written (still running, or the bot died)."""
        return self.finished_at is None

    def as_dict(self) -> dict[str, Any]:
        finished = None if self.finished_at is None else iso(self.finished_at)
        shown = {"gpus": list(self.gpus), "started_at": iso(self.started_at)}
        return asdict(self) | shown | {"finished_at": finished}


@dataclass(frozen=True)
class ActionDetail:
    """An action's intent, every event recorded for it, and its outcome."""

    summary: ActionSummary
    plan: Any  # the plan given to begin_action (decoded JSON) or None
    events: tuple[AuditRecord, ...]
    result: Any  # the result given to finish_action (decoded JSON) or None
    records: tuple[AuditRecord, ...]  # intent, events, outcome: as stored

    @property
    def approval(self) -> dict[str, Any] | None:
        """Return who asked for and who approved a forced action (None: not an approved one)."""
        found = self.plan.get("approval") if isinstance(self.plan, Mapping) else None
        return dict(found) if isinstance(found, Mapping) else None

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.summary.as_dict(),
            "approval": self.approval,
            "plan": self.plan,
            "events": [{"at": e.created_at, **_as_object(e.data)} for e in self.events],
            "result": self.result,
            "records": [r.seq for r in self.records],
        }


def _as_object(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {"value": value}


@dataclass(frozen=True)
class Seal:
    """One seal record, as read from the chain (see ``store.seals``)."""

    seq: int
    at: str  # its created_at (store time text)
    reason: str  # start, periodic, forced or stop
    every_s: float  # the interval the sealing bot ran with
    prev: tuple[int, str] | None  # the last record the sealing process wrote before it

    @property
    def time(self) -> datetime:
        return parse_iso(self.at)

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "at": self.at, "reason": self.reason, "every_s": self.every_s}


@dataclass(frozen=True)
class VerifyResult:
    """What walking the hash chain found."""

    ok: bool  # intact, checked with the key it needs, holding the published head (if given)
    checked: int  # records found intact before the first bad one (all of them when ok)
    first_bad_seq: int | None  # None when nothing was found bad (ok, or unverified)
    reason: str  # one line for a person: what the walk found
    head_hash: str  # the last intact record's hash: note it elsewhere to anchor the chain
    head_seq: int = 0  # the last intact record's seq (0: none)
    mode: str = "plain"  # "plain" (sha256) or "keyed" (HMAC-SHA256 from record keyed_from on)
    keyed_from: int | None = None
    key_id: str | None = None  # the key a keyed log names
    unverified: bool = False  # the walk could not check: no key, or another key
    published: str | None = None  # why the log does not hold the published head (None: it does)
    seal: Seal | None = None  # the newest keyed seal walked
    seals: int = 0  # keyed seals walked
    seal_age_s: float | None = None  # the newest seal's age when its age was checked
    end: tuple[str, ...] = ()  # why the log's end is not vouched for (seals, the head file)
    end_tampered: bool = False  # one of those shows records were removed
    file_head: tuple[int, str, str] | None = None  # (seq, hash, at) of a head file the log holds

    @property
    def head(self) -> str:
        """Return ``SEQ:HASH`` of the last intact record, as ``--expect-head`` takes it."""
        return f"{self.head_seq}:{self.head_hash}"

    def mode_text(self) -> str:
        if self.mode == "keyed":
            return f"keyed (HMAC-SHA256 from record {self.keyed_from}, key id {self.key_id})"
        return "plain (sha256, no key)"

    def line(self) -> str:
        """Return the verdict in one line: intact, tampered, or not verified."""
        if self.ok:
            return (
                f"audit log intact: {self.checked} records, head {self.head}, {self.mode_text()}"
                + self._end_text()
            )
        parts = [self.published] if self.published else []
        parts += self.end
        if self.first_bad_seq is not None:
            parts.append(f"{self.reason} ({self.checked} records intact before it)")
        elif self.unverified:
            parts.append(self.reason)
        tampered = self.first_bad_seq is not None or self.published is not None
        tampered = tampered or self.end_tampered
        return f"audit log {'tampered' if tampered else 'not verified'}: " + "; ".join(parts)

    def _end_text(self) -> str:
        """What vouches for the end of an intact log: its newest seal, the head file."""
        out = ""
        if self.seal is not None:
            age_s = self.seal_age_s
            age = "" if age_s is None else f", {durations.format(age_s, 'people')} old"
            out += (
                f"; newest seal: record {self.seal.seq} ({self.seal.reason}, {self.seal.at}{age})"
            )
        if self.file_head is not None:
            out += f"; holds the head file's record {self.file_head[0]} ({self.file_head[2]})"
        return out

    def as_dict(self) -> dict[str, Any]:
        """``audit verify --json``."""
        seal = None if self.seal is None else {**self.seal.as_dict(), "age_s": self.seal_age_s}
        head_file = None
        if self.file_head is not None:
            seq, digest, at = self.file_head
            head_file = {"seq": seq, "hash": digest, "at": at}
        return {
            "ok": self.ok,
            "verdict": self.line(),
            "checked": self.checked,
            "head": self.head if self.head_seq else None,
            "mode": self.mode,
            "keyed_from": self.keyed_from,
            "key_id": self.key_id,
            "first_bad_seq": self.first_bad_seq,
            "reason": self.reason,
            "unverified": self.unverified,
            "published": self.published,
            "seal": seal,
            "seals": self.seals,
            "end": list(self.end),
            "end_tampered": self.end_tampered,
            "head_file": head_file,
        }
