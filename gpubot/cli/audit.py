"""``gpubot audit list | show ID | review ID | export | verify``: read the audit log and check
its chain. ``list`` shows what people did or approved (``--kind`` picks kinds of record:
``cli.audit_records``); ``show`` any one action or record. ``list --incomplete`` lists
interrupted actions (an intent, no outcome) that no one has marked reviewed; ``review ID``
marks one reviewed, as a record of its own in the chain.

``verify`` reads the chain's key from ``$GPUBOT_AUDIT_KEY`` (a keyed log cannot be verified
without it) and, with ``--expect-head SEQ:HASH``, checks the log against a head noted elsewhere
(the bot posts one to the alerts channel): that catches a rewrite even without the key. A
keyed log's newest seal must be younger than ``[audit] max_seal_age`` (``--max-seal-age``
overrides it, e.g. ``off`` for an archive or a bot stopped on purpose), and with ``[audit]
head_file`` the log must hold the head recorded there: both catch records cut from the end.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields
from datetime import UTC, datetime
from typing import Any, TextIO

from gpubot.app import open_app_store, settings_from
from gpubot.cli.audit_records import action_cells, print_listing, show_record, when, write_table
from gpubot.cli.common import cli_actor
from gpubot.config import AuditSettings
from gpubot.core import durations
from gpubot.errors import UsageError
from gpubot.store import ActionDetail, ActionSummary, AuditRecord, SealRule, Store
from gpubot.store.audit_kinds import BY_NAME, AuditListing, ListFilter, parse_kinds
from gpubot.store.query_records import node_count

EXPORT_FIELDS = tuple(f.name for f in fields(AuditRecord))  # as stored, in order


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="audit_command", metavar="ACTION", required=True)
    ls = sub.add_parser("list", help="list what people did or approved, newest first")
    ls.add_argument(
        "--kind",
        action="append",
        metavar="KIND",
        help=f"only these kinds of record (repeat, or a comma list): {', '.join(BY_NAME)}; "
        "default: what people did or approved (action, review, claim, approval, ladder)",
    )
    ls.add_argument("--node", help="only records of this node")
    ls.add_argument("--actor", help="only actors whose id or name contains this")
    ls.add_argument("--since", help="2h, 1h30m, 7d ... or an ISO time (UTC unless it says)")
    ls.add_argument("--limit", default="50", help="at most this many (default 50)")
    ls.add_argument("--queries", action="store_true", help="list status and sweep queries")
    ls.add_argument(
        "--incomplete", action="store_true", help="only interrupted actions not marked reviewed"
    )
    ls.add_argument("--json", action="store_true", help="print JSON")
    show = sub.add_parser("show", help="show one action (intent, events, outcome) or record")
    show.add_argument("id", metavar="ID")
    show.add_argument("--json", action="store_true", help="print JSON")
    rev = sub.add_parser("review", help="mark interrupted actions reviewed (recorded)")
    rev.add_argument("ids", nargs="+", metavar="ID")
    rev.add_argument("--note", default="", help="what was found on the node")
    exp = sub.add_parser("export", help="print every record as stored, hashes included")
    exp.add_argument("--format", default="jsonl", help="jsonl (default) or csv")
    exp.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help="write to PATH (created 0600) instead of standard output",
    )
    ver = sub.add_parser("verify", help="walk the hash chain; exit 1 naming the first bad record")
    ver.add_argument(
        "--expect-head",
        metavar="SEQ:HASH",
        help="fail unless the log holds this head (as verify or the bot printed it)",
    )
    ver.add_argument(
        "--max-seal-age",
        metavar="AGE",
        help="fail when a keyed log's newest seal is older (30m, 1h30m ...; off: do not check); "
        "default: [audit] max_seal_age",
    )
    ver.add_argument("--json", action="store_true", help="print the verdict as JSON")


def run(args: argparse.Namespace) -> int:
    check_args(args)
    settings = settings_from(args.config, os.environ)
    if args.audit_command == "verify":
        args.seals = seal_rule(args.max_seal_age, settings.audit)
    store = open_app_store(settings, os.environ, check_schema=True)
    try:
        return asyncio.run(_run(store, args, sys.stdout))
    finally:
        store.close()


def check_args(args: argparse.Namespace) -> None:
    if args.audit_command == "list":
        args.limit = positive_int("--limit", args.limit)
        args.since = None if args.since is None else parse_since(args.since, datetime.now(UTC))
        if args.queries and args.node:
            raise UsageError("--node does not apply to --queries (they may span many nodes)")
        if args.queries and args.incomplete:
            raise UsageError("--incomplete does not apply to --queries (queries do not end)")
        if args.kind and (args.queries or args.incomplete):
            raise UsageError(
                "--kind does not apply to --queries or --incomplete (use --kind query)"
            )
        try:
            args.kind = None if not args.kind else parse_kinds(args.kind)
        except ValueError as exc:
            raise UsageError(f"--kind: {exc}") from None
    elif args.audit_command == "show":
        args.id = positive_int("ID", args.id)
    elif args.audit_command == "review":
        args.ids = [positive_int("ID", i) for i in args.ids]
    elif args.audit_command == "export" and args.format not in ("jsonl", "csv"):
        raise UsageError(f"--format: expected jsonl or csv, got {args.format!r}")
    elif args.audit_command == "verify":
        if args.expect_head is not None:
            args.expect_head = parse_head(args.expect_head)
        if args.max_seal_age not in (None, "off"):
            try:
                args.max_seal_age = durations.parse(args.max_seal_age)
            except durations.DurationError as exc:
                raise UsageError(
                    f"--max-seal-age: {exc.expected}, or off, got {exc.text!r}"
                ) from None


def seal_rule(option: float | str | None, audit: AuditSettings) -> SealRule | None:
    """Return how verify judges the newest seal: ``--max-seal-age``, else the settings."""
    if option == "off":
        return None
    if isinstance(option, float):
        return SealRule(option)
    if audit.seal_every_s is None or not audit.check_seals:
        return None  # nothing seals this log, or the check is off
    return SealRule(audit.max_seal_age_s)


def parse_head(text: str) -> tuple[int, str]:
    """Parse ``SEQ:HASH`` (a record's seq and its 64 hex digit hash)."""
    m = re.fullmatch(r"\s*([0-9]{1,18}):([0-9a-fA-F]{64})\s*", text)
    if m is None or int(m[1]) < 1:
        raise UsageError(
            f"--expect-head: expected SEQ:HASH as `gpubot audit verify` prints it "
            f"(e.g. 42:9f86d081…, 64 hex digits), got {text!r}"
        )
    return int(m[1]), m[2].lower()


def positive_int(name: str, text: str) -> int:
    if not re.fullmatch(r"[0-9]+", text.strip()) or int(text) < 1:
        raise UsageError(f"{name}: expected a whole number > 0, got {text!r}")
    return int(text)


def parse_since(text: str, now: datetime) -> datetime:
    """``--since``: a duration before ``now`` or an ISO time (``durations.when``)."""
    try:
        return datetime.fromtimestamp(durations.when(text, now.timestamp(), "--since"), UTC)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


async def _run(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    cmd = args.audit_command
    if cmd == "list" and args.queries:
        qs = await store.queries(actor=args.actor, since=args.since, limit=args.limit)
        _print_queries(qs, args.json, out)
    elif cmd == "list" and args.incomplete:
        _print_actions(_matching(await store.interrupted(), args), args.json, out)
    elif cmd == "list":
        f = ListFilter(args.kind, args.node, args.actor, args.since, args.limit)
        empty = "no actions match" if args.kind is None else "no records match"
        print_listing(await AuditListing(store.engine).list(f), args.json, out, empty)
    elif cmd == "review":
        await _review(store, args.ids, args.note, out)
    elif cmd == "show":
        await _show_one(store, args.id, args.json, out)
    elif cmd == "export":
        with _output(args.output, out) as dest:
            await _export(store, args.format, dest)
    else:
        return await _verify(store, args, out)
    return 0


async def _show_one(store: Store, seq: int, as_json: bool, out: TextIO) -> None:
    """Print action ``seq`` (its intent's seq) in full, or else the record ``seq``."""
    detail = await store.action(seq)
    if detail is not None:
        out.write(json.dumps(detail.as_dict(), indent=2) + "\n" if as_json else _show(detail))
        return
    rec = await AuditListing(store.engine).record(seq)
    if rec is None:
        raise UsageError(f"there is no action {seq} in the audit log, nor a record {seq}")
    if as_json:
        out.write(json.dumps({**rec.as_dict(), "payload": rec.data}, indent=2) + "\n")
    else:
        out.write(show_record(rec))


def _matching(acts: list[ActionSummary], args: argparse.Namespace) -> list[ActionSummary]:
    """Apply ``list``'s filters to interrupted actions (few: the query reads them all)."""
    acts = [a for a in acts if args.node is None or a.node == args.node]
    acts = [a for a in acts if args.actor is None or args.actor in a.actor]
    acts = [a for a in acts if args.since is None or a.started_at >= args.since]
    return acts[: args.limit]


async def _review(store: Store, ids: list[int], note: str, out: TextIO) -> None:
    """Mark each action reviewed, by the CLI's user; stop at the first that cannot be."""
    for action_id in ids:
        rec = await store.review_action(action_id, actor=cli_actor(), source="cli", note=note)
        out.write(f"action {action_id} marked reviewed by {rec.actor} (audit record {rec.seq})\n")


async def _verify(store: Store, args: argparse.Namespace, out: TextIO) -> int:
    result = await store.verify(published=args.expect_head, seals=args.seals)
    if args.json:
        data = result.as_dict()
        if args.expect_head is not None:
            data["expect_head"] = f"{args.expect_head[0]}:{args.expect_head[1]}"
        out.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        return 0 if result.ok else 1
    if not result.ok:
        print(f"gpubot: {result.line()}", file=sys.stderr)
        return 1
    held = f", holds {args.expect_head[0]}:{args.expect_head[1]}" if args.expect_head else ""
    out.write(f"{result.line()}{held}\n")
    return 0


@contextmanager
def _output(path: str | None, out: TextIO) -> Iterator[TextIO]:
    """Yield ``out``, or the file at ``path`` created (or truncated) ``0600`` before any write."""
    if path is None:
        yield out
        return
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise UsageError(f"--output: cannot write {path}: {exc.strerror}") from None
    try:
        os.fchmod(fd, 0o600)  # whatever the umask, and for a file that was there already
    except OSError as exc:
        os.close(fd)
        raise UsageError(f"--output: cannot make {path} private: {exc.strerror}") from None
    with open(fd, "w", encoding="utf-8", newline="") as f:
        yield f


def _print_actions(acts: list[ActionSummary], as_json: bool, out: TextIO) -> None:
    if as_json:
        out.write(json.dumps([a.as_dict() for a in acts], indent=2) + "\n")
        return
    if not acts:
        out.write("no actions match\n")
        return
    rows = [("ID", "STARTED (UTC)", "STATUS", "NODE", "GPUS", "ACTOR", "SOURCE", "COMMAND")]
    write_table(rows + [action_cells(a, kind=False) for a in acts], out)


def _print_queries(qs: list[AuditRecord], as_json: bool, out: TextIO) -> None:
    if as_json:
        out.write(json.dumps([{**q.as_dict(), "payload": q.data} for q in qs], indent=2) + "\n")
        return
    if not qs:
        out.write("no queries match\n")
        return
    rows = [("SEQ", "TIME (UTC)", "QUERY", "ACTOR", "SOURCE", "NODES", "FAILED", "SECONDS")]
    for q in qs:
        d: dict[str, Any] = q.data
        rows.append(
            (
                str(q.seq),
                when(q.time),
                str(d.get("query")),
                q.actor,
                q.source,
                str(node_count(d)),
                ",".join(d.get("failed", {})) or "-",
                f"{d.get('seconds', 0):.2f}",
            )
        )
    write_table(rows, out)


def _show(d: ActionDetail) -> str:
    s = d.summary
    took = (
        ""
        if s.finished_at is None
        else f" ({(s.finished_at - s.started_at).total_seconds():.1f} s)"
    )
    gpus = ",".join(map(str, s.gpus)) or "-"
    lines = [
        f"action {s.id}: {s.kind} on {s.node or '-'} GPUs {gpus}: {s.status}",
        f"  who:      {s.actor} via {s.source}",
        *([] if (a := d.approval) is None else [_approval(a)]),
        f"  command:  {s.command}",
        f"  started:  {when(s.started_at)} UTC   finished: {when(s.finished_at)}{took}",
        f"  plan:     {json.dumps(d.plan, sort_keys=True)}",
        f"  events:   {len(d.events)}",
    ]
    lines += [f"    {when(e.time)}  {e.payload}" for e in d.events]
    lines += [
        f"  reviewed: by {r.actor} at {when(r.time)} UTC: {r.data.get('note') or '-'}"
        for r in d.records
        if r.kind == "review"
    ]
    lines.append(f"  result:   {json.dumps(d.result, sort_keys=True)}")
    lines.append(f"  records:  {', '.join(str(r.seq) for r in d.records)}")
    return "\n".join(lines) + "\n"


def _approval(a: dict[str, Any]) -> str:
    return (
        f"  approval: #{a.get('id')} requested by {a.get('requester')} "
        f"({a.get('requester_name') or '-'}), approved by {a.get('approver')} "
        f"({a.get('approver_name') or '-'})"
    )


async def _export(store: Store, fmt: str, out: TextIO) -> None:
    writer = csv.DictWriter(out, fieldnames=EXPORT_FIELDS) if fmt == "csv" else None
    if writer is not None:
        writer.writeheader()
    after = 0
    while batch := await store.records(after=after):
        for r in batch:
            if writer is not None:
                writer.writerow(r.as_dict())
            else:
                out.write(json.dumps(r.as_dict(), ensure_ascii=False) + "\n")
        after = batch[-1].seq
