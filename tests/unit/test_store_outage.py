"""An outage of the audit database is two lines, not one per duty per turn (issue 34):
``store.engine.unreachable`` tells an outage from a failed statement, ``guard`` raises
``DatabaseUnreachable`` for it and tells the one reporter (``store.outage.OUTAGE``), and while
it is watched the records that only repeat the outage are dropped. The real outage, under two
``gpubot serve`` replicas, is ``tests/integration/test_db_outage_duties.py``."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import errors as pg
from sqlalchemy import exc as sa

from gpubot.errors import DUTY_TURN, DatabaseUnreachable, LeaseLost, StoreError
from gpubot.store.engine import guard, unreachable
from gpubot.store.outage import Outage, carries_unreachable


def wrapped(orig: BaseException, *, invalidated: bool = False) -> sa.DBAPIError:
    """The error SQLAlchemy raises for a driver's ``orig``."""
    return sa.DBAPIError.instance(  # type: ignore[return-value]
        "SELECT 1", {}, orig, Exception, connection_invalidated=invalidated
    )


@pytest.mark.parametrize(
    ("exc", "outage_"),
    [
        (wrapped(psycopg.OperationalError("connection failed: Connection refused")), True),
        (wrapped(psycopg.OperationalError("consuming input failed: server closed")), True),
        (wrapped(pg.AdminShutdown("terminating connection due to administrator command")), True),
        (wrapped(pg.CannotConnectNow("the database system is shutting down")), True),
        (wrapped(pg.ConnectionFailure("connection failure")), True),
        (wrapped(psycopg.InterfaceError("the connection is closed")), True),
        (wrapped(RuntimeError("any"), invalidated=True), True),  # SQLAlchemy saw it drop
        (wrapped(pg.QueryCanceled("canceling statement due to statement timeout")), False),
        (wrapped(pg.LockNotAvailable("could not obtain lock")), False),
        (wrapped(pg.UniqueViolation("duplicate key value")), False),
        (wrapped(pg.UndefinedTable('relation "x" does not exist')), False),
        (wrapped(sqlite3.OperationalError("database is locked")), False),
        (wrapped(sqlite3.OperationalError("unable to open database file")), False),
        (sa.TimeoutError("QueuePool limit of size 5 overflow 10 reached"), False),
        (OSError("disk full"), False),
    ],
)
def test_an_outage_is_told_from_a_failed_statement(exc: BaseException, outage_: bool) -> None:
    assert unreachable(exc) is outage_


class Clock:
    """Wall and monotonic time that the test moves (the wall one may step; see below)."""

    def __init__(self) -> None:
        self.wall_s = 1_800_000_000.0
        self.mono_s = 100.0

    def wall(self) -> float:
        return self.wall_s

    def mono(self) -> float:
        return self.mono_s

    def advance(self, s: float) -> None:
        self.wall_s += s
        self.mono_s += s


class Lines(logging.Handler):
    """The records a logger's handler was given (after its filters)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def said(self) -> list[str]:
        return [f"{r.levelname} {r.getMessage()}" for r in self.records]


@pytest.fixture
def log() -> Iterator[tuple[logging.Logger, Lines]]:
    logger = logging.getLogger("tests.unit.store_outage")
    logger.propagate = False
    lines = Lines()
    logger.addHandler(lines)
    try:
        yield logger, lines
    finally:
        logger.removeHandler(lines)
        logger.propagate = True


def down(why: str = "cannot end holds: connection refused") -> DatabaseUnreachable:
    return DatabaseUnreachable(why)


def a_turn_of_each_duty(logger: logging.Logger, reporter: Outage, n: int) -> None:
    """What the duties do on a turn while the database is down: the store tells the reporter,
    each duty logs its own line (as ``log.warning("...: %s", exc)`` and ``log.exception``)."""
    for _ in range(n):
        reporter.failed("cannot end holds: connection refused")
        logger.warning("claims duty skipped: %s", down(), extra=DUTY_TURN)
        logger.error("sweep alerts not updated: %s", down(), extra=DUTY_TURN)
        logger.warning("%s: it expires by itself within %g s", down(), 30.0, extra=DUTY_TURN)
        try:
            raise down()
        except DatabaseUnreachable:
            logger.exception(
                "claims unavailable: this sweep counts no GPU as claimed", extra=DUTY_TURN
            )


def test_an_outage_is_one_line_when_it_starts_and_one_when_it_ends(
    log: tuple[logging.Logger, Lines],
) -> None:
    logger, lines = log
    clock = Clock()
    reporter = Outage(logger, wall=clock.wall, mono=clock.mono)
    with reporter.watched(logger):
        for _ in range(20):
            a_turn_of_each_duty(logger, reporter, 1)
            clock.advance(1.0)
        clock.wall_s -= 3600  # a wall-clock step back meanwhile does not shorten the outage
        reporter.answered()
        reporter.answered()  # the next statements: nothing more to say
        logger.warning("claims duty skipped: %s", StoreError("cannot end holds: no such table"))
        logger.error("%s", LeaseLost("node:node1", "the lease on node1 is lost"))
    assert lines.said() == [
        "ERROR audit database unreachable since 2027-01-15T08:00:00Z: cannot end holds: "
        "connection refused (duties that need it skip their turns until it is back)",
        "WARNING audit database reachable again after 20 s (unreachable since "
        "2027-01-15T08:00:00Z)",
        # Failures for any other reason still log as they did, one line each:
        "WARNING claims duty skipped: cannot end holds: no such table",
        "ERROR the lease on node1 is lost",
    ]
    assert reporter.up()


def one_approval_and_a_duty(logger: logging.Logger) -> None:
    """A retry's approval whose end cannot be recorded (the reset ran; it stays approved), a
    wait that cannot be recorded, and a duty's turn, all for the same outage."""
    logger.error("approval %s: cannot record its end: %s", 7, down())
    logger.warning("approval %s: cannot record that it waits: %s", 8, down())
    logger.warning("claims duty skipped: %s", down(), extra=DUTY_TURN)


def test_a_line_about_one_action_still_logs_during_an_outage(
    log: tuple[logging.Logger, Lines],
) -> None:
    logger, lines = log
    reporter = Outage(logger)
    with reporter.watched(logger):
        logger.warning("claims duty skipped: %s", down(), extra=DUTY_TURN)  # not said yet
        reporter.failed("cannot end holds: connection refused")
        for _ in range(3):
            one_approval_and_a_duty(logger)
    said = [r.getMessage() for r in lines.records]
    assert said[0] == "claims duty skipped: cannot end holds: connection refused"
    assert said[1].startswith("audit database unreachable since ")
    assert said[2:] == 3 * [
        "approval 7: cannot record its end: cannot end holds: connection refused",
        "approval 8: cannot record that it waits: cannot end holds: connection refused",
    ]


def test_control_the_old_filter_drops_the_action_lines_too(
    log: tuple[logging.Logger, Lines], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As before: any record carrying the outage was dropped, whatever it was about."""
    logger, lines = log
    monkeypatch.setattr(
        "gpubot.store.outage.SaidOnce.filter", lambda self, r: not carries_unreachable(r)
    )
    reporter = Outage(logger)
    with reporter.watched(logger):
        reporter.failed("cannot end holds: connection refused")
        one_approval_and_a_duty(logger)
    (said,) = lines.records  # the outage's line alone: the approval's end is lost
    assert said.getMessage().startswith("audit database unreachable since ")


def test_control_unwatched_every_duty_says_it_on_every_turn(
    log: tuple[logging.Logger, Lines],
) -> None:
    """Without the watch (as before issue 34): 4 lines a turn, a traceback among them."""
    logger, lines = log
    reporter = Outage(logger)
    a_turn_of_each_duty(logger, reporter, 5)
    reporter.answered()
    assert len(lines.records) == 20
    assert sum(r.exc_info is not None for r in lines.records) == 5


def test_the_watch_ends_with_its_block(log: tuple[logging.Logger, Lines]) -> None:
    logger, lines = log
    reporter = Outage(logger)
    with reporter.watched(logger):
        reporter.failed("cannot read: connection refused")
    assert reporter.up()  # an outage still open at the end is forgotten, not carried over
    logger.warning("claims duty skipped: %s", down())
    assert [r.getMessage() for r in lines.records][1:] == [
        "claims duty skipped: cannot end holds: connection refused"
    ]
    assert not lines.filters


def test_guard_raises_database_unreachable_and_tells_the_reporter_once(
    monkeypatch: pytest.MonkeyPatch, log: tuple[logging.Logger, Lines]
) -> None:
    logger, lines = log
    reporter = Outage(logger)
    monkeypatch.setattr("gpubot.store.engine.OUTAGE", reporter)
    refused = wrapped(psycopg.OperationalError("connection failed: Connection refused"))
    with reporter.watched(logger):
        for what in ("cannot end holds", "cannot take the lease 'sweep'"):
            with (
                pytest.raises(DatabaseUnreachable, match=f"^{what}: connection failed"),
                guard(what),
            ):
                raise refused
        with pytest.raises(StoreError) as raised, guard("cannot record"):  # not an outage
            raise wrapped(pg.UniqueViolation("duplicate key value"))
    assert not isinstance(raised.value, DatabaseUnreachable)
    (said,) = lines.records  # the first failure, once
    assert said.getMessage().startswith("audit database unreachable since ")
    assert "cannot end holds: connection failed: Connection refused" in said.getMessage()
