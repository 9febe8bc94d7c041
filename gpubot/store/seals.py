"""Seal records: what makes cutting the end off a keyed audit log show (pure, no database).

A hash chain proves its records follow each other, not where it ends: whoever can write the
database can delete the last records and move the head back. So ``gpubot serve`` with
``$GPUBOT_AUDIT_KEY`` appends a keyed *seal* at a fixed interval, at start and stop, and after
every forced action, and ``verify`` checks:

* **age**: the newest seal must be younger than ``[audit] max_seal_age``; a cut takes the seals
  after it, so the newest left grows old. A seal is written even when nothing happened: a quiet
  log and a cut one could not be told apart otherwise.
* **links**: ``prev`` names the last record the sealing process wrote, so a cut after which the
  chain goes on leaves a seal naming a record the log no longer holds.

Not caught: a cut within one interval after the newest seal, and one made while the bot is
stopped back to an older seal; the head file covers those. Anyone holding the key can forge seals.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpubot.core import durations
from gpubot.store.records import AuditRecord, Seal

SEAL = "seal"  # the record kind
REASONS = ("start", "periodic", "forced", "stop")
RECENT = 4096  # records whose hashes a walk keeps at hand to check a seal's link


@dataclass(frozen=True)
class SealRule:
    """How ``verify`` judges the newest seal's age: ``max_age_s`` None is twice its interval."""

    max_age_s: float | None = None


def seal_payload(
    reason: str, every_s: float, prev: tuple[int, str] | None, after: int | None = None
) -> dict[str, Any]:
    """Return the payload of a seal record (kept small: a log gains one every interval)."""
    if reason not in REASONS:
        raise ValueError(f"not a seal reason: {reason!r}")
    out: dict[str, Any] = {
        "seal": reason,
        "every_s": int(every_s),
        "prev": None if prev is None else [prev[0], prev[1]],
    }
    if after is not None:
        out["after"] = after  # the forced action this seal follows
    return out


def parse_seal(r: AuditRecord) -> Seal | None:
    """Return the seal ``r`` holds, or None if its payload is not one."""
    try:
        d = json.loads(r.payload)
    except ValueError:
        return None
    if not isinstance(d, dict) or d.get("seal") not in REASONS:
        return None
    every, prev = d.get("every_s"), d.get("prev")
    if isinstance(every, bool) or not isinstance(every, int) or every <= 0:
        return None
    link: tuple[int, str] | None = None
    if prev is not None:  # [SEQ, "HASH"]
        if not (isinstance(prev, list) and len(prev) == 2 and type(prev[0]) is int):
            return None
        if not isinstance(prev[1], str):
            return None
        link = (prev[0], prev[1])
    return Seal(r.seq, r.created_at, str(d["seal"]), float(every), link)


class SealTrail:
    """The seals met while walking a chain: the newest, how many, and the first broken link."""

    def __init__(self, seq_of_hash: Callable[[str], int | None]) -> None:
        self.seq_of_hash = seq_of_hash
        self.recent: OrderedDict[int, str] = OrderedDict()
        self.newest: Seal | None = None
        self.count = 0
        self.broken: str | None = None  # why a seal's link shows records were removed

    def see(self, r: AuditRecord, keyed: bool) -> str | None:
        """Take one intact record; return why it is a bad seal. Only keyed seals count: anybody
        who can write the database could forge a plain one."""
        self.recent[r.seq] = r.hash
        if len(self.recent) > RECENT:
            self.recent.popitem(last=False)
        if r.kind != SEAL or not keyed:
            return None
        seal = parse_seal(r)
        if seal is None:
            return f"record {r.seq} is a seal that cannot be read"
        self.newest, self.count = seal, self.count + 1
        if seal.prev is not None and self.broken is None and not self._holds(seal):
            p_seq, p_hash = seal.prev
            self.broken = (
                f"seal {seal.seq} ({seal.at}) names record {p_seq} ({p_hash[:16]}…) as the last "
                f"one gpubot wrote before it, and the log's record {p_seq} is another: records "
                "were removed and the chain continued"
            )
        return None

    def _holds(self, seal: Seal) -> bool:
        assert seal.prev is not None
        p_seq, p_hash = seal.prev
        if p_seq >= seal.seq:
            return False
        if p_seq in self.recent:
            return self.recent[p_seq] == p_hash
        return self.seq_of_hash(p_hash) == p_seq


def age_problem(newest: Seal | None, now: datetime, rule: SealRule) -> str | None:
    """Return why the newest seal does not vouch for the log's end (None: it does)."""
    if newest is None:
        return (
            "the keyed log holds no seal: records were removed back to before the first one, "
            'or gpubot serve never sealed it (where none runs, set [audit] max_seal_age = "off")'
        )
    limit = 2 * newest.every_s if rule.max_age_s is None else rule.max_age_s
    age = (now - newest.time).total_seconds()
    if age <= limit:
        return None
    what = f"the newest seal (record {newest.seq}, {newest.reason}, {newest.at})"
    if newest.reason == "stop":
        what = f"the log ends with gpubot stopping (seal {newest.seq}, {newest.at})"
    return (
        f"{what} is {durations.format(age, 'people')} old, more than "
        f"{durations.format(limit, 'people')} ([audit] max_seal_age): records after it were "
        "removed, or gpubot serve has not run since"
    )
