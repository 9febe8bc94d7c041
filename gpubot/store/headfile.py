"""The chain head written outside the database (``[audit] head_file``): the file adapter.

After every audit write the file is replaced atomically by one JSON line: seq, hash, time and
(with ``$GPUBOT_AUDIT_KEY``) their HMAC. ``verify`` reads it before its snapshot of the database
and fails when the log does not hold that head (records were removed).

A writer never moves the file to a head that does not extend its own: if the log no longer
holds it, the file is kept as the evidence. Writers take an ``flock``, so two processes never
move it backwards.

What it cannot catch: an attacker who can also write this file (put it elsewhere, or where only
gpubot's account writes), or who holds the key; a write lost when the file could not be written
(logged).
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

from gpubot.errors import StoreError
from gpubot.store.chain import KEY_ID, canonical_json, key_id

log = logging.getLogger(__name__)

HEX64 = re.compile(r"[0-9a-f]{64}")
MAX_BYTES = 4096  # a head is one short line; anything longer is not gpubot's


class HeadFileError(StoreError):
    """The head file cannot be read, or holds no head gpubot wrote (one line)."""


class HeadFileMissing(HeadFileError):
    """The head file does not exist."""


@dataclass(frozen=True)
class FileHead:
    """The head a head file holds."""

    seq: int
    hash: str
    at: str  # the time of the record (store time text)
    key_id: str | None
    mac: str | None


def head_mac(key: bytes, seq: int, digest: str, at: str) -> str:
    body = canonical_json({"file": "gpubot audit head", "seq": seq, "hash": digest, "at": at})
    return hmac.new(key, body.encode("utf-8"), hashlib.sha256).hexdigest()


def make_head(seq: int, digest: str, at: str, key: bytes | None) -> FileHead:
    """Build the head to write for record ``seq`` (MAC'd when there is a key)."""
    if key is None:
        return FileHead(seq, digest, at, None, None)
    return FileHead(seq, digest, at, key_id(key), head_mac(key, seq, digest, at))


def parse_head(text: str) -> FileHead:
    """Parse a head file's text; ValueError says what is wrong."""
    data = json.loads(text)
    if not isinstance(data, dict) or set(data) != {"seq", "hash", "at", "key_id", "mac"}:
        raise ValueError("not a gpubot head (expected seq, hash, at, key_id, mac)")
    seq, digest, at, kid, mac = (data[k] for k in ("seq", "hash", "at", "key_id", "mac"))
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise ValueError(f"seq: expected a record number, got {seq!r}")
    for name, value in (("hash", digest), ("mac", mac)):
        if value is not None and not (isinstance(value, str) and HEX64.fullmatch(value)):
            raise ValueError(f"{name}: expected 64 hex digits")
    if digest is None or not isinstance(at, str):
        raise ValueError("hash and at are required")
    if kid is not None and not (isinstance(kid, str) and KEY_ID.fullmatch(kid)):
        raise ValueError("key_id: expected 16 hex digits")
    return FileHead(seq, digest, at, kid, mac)


class HeadFile:
    """Reads and writes one head file."""

    def __init__(self, path: str, key: bytes | None) -> None:
        self.path = path
        self.key = key
        self._said: str | None = None  # the last failure logged (said once until it changes)

    def read(self) -> FileHead:
        """Return the head the file holds; ``HeadFileError`` (one line) if it cannot be read."""
        try:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_BYTES + 1)
        except FileNotFoundError:
            raise HeadFileMissing(f"the head file {self.path} does not exist") from None
        except OSError as exc:
            raise HeadFileError(f"cannot read the head file {self.path}: {exc.strerror}") from None
        try:
            if len(raw) > MAX_BYTES:
                raise ValueError(f"longer than {MAX_BYTES} bytes")
            return parse_head(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise HeadFileError(f"the head file {self.path} holds no gpubot head: {exc}") from None

    def record(self, seq: int, digest: str, at: str, held: Callable[[int, str], bool]) -> None:
        """Write record ``seq`` as the head, unless the file's head is newer or not in the log.
        Never raises: the record is in the database already; a failure is logged once."""
        try:
            with self._locked():
                self._record(seq, digest, at, held)
        except (OSError, StoreError) as exc:
            why = getattr(exc, "strerror", None) or str(exc)
            self._say(f"the audit head was not written to {self.path}: {why}")

    def _record(self, seq: int, digest: str, at: str, held: Callable[[int, str], bool]) -> None:
        try:
            current: FileHead | None = self.read()
        except HeadFileMissing:
            current = None
        except HeadFileError as exc:
            self._say(f"{exc}: it is kept as it is; move it away once explained")
            return
        if current is not None and not held(current.seq, current.hash):
            self._say(
                f"the audit log no longer holds the head recorded in {self.path} (seq "
                f"{current.seq} at {current.at}): records were removed; the file is kept as "
                "the evidence (`gpubot audit verify` reports it; move it away once explained)"
            )
            return
        if current is not None and current.seq >= seq:
            return  # another writer recorded a later head already
        self._write(make_head(seq, digest, at, self.key))
        self._said = None

    def _say(self, line: str) -> None:
        if line != self._said:
            log.error("%s", line)
            self._said = line

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold an exclusive ``flock`` on a lock file beside the head file (closing frees it)."""
        fd = os.open(
            self.path + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _write(self, head: FileHead) -> None:
        """Replace the file atomically: a temporary file beside it, fsync, rename, fsync."""
        folder = os.path.dirname(self.path) or "."
        tmp = os.path.join(folder, f".{os.path.basename(self.path)}.{os.getpid()}.tmp")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o644)
        try:
            os.write(fd, (json.dumps(asdict(head), sort_keys=True) + "\n").encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def compare(
    head: FileHead, path: str, found: str | None, db_seq: int, key: bytes | None
) -> tuple[str, bool] | None:
    """Return (why, tampered) when the log does not hold the file's ``head``; None when it does."""
    where = f"seq {head.seq} at {head.at}, in {path}"
    if key is not None:
        if head.mac is None:
            return (
                f"the head file {path} carries no MAC, yet GPUBOT_AUDIT_KEY is set: it was "
                "not written by gpubot with this key"
            ), True
        if not hmac.compare_digest(head.mac, head_mac(key, head.seq, head.hash, head.at)):
            return f"the head file {path} was edited: its MAC does not match the key", True
    if found == head.hash:
        return None
    if head.seq > db_seq:
        return (
            f"the log ends at record {db_seq}, before the head recorded outside the database "
            f"({where}): records were removed"
        ), True
    return (
        f"record {head.seq} is not the head recorded outside the database ({where}): "
        "records were removed and the chain continued, or the log was rewritten"
    ), True
