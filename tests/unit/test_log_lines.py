"""The text log is one line a record: no message can start a line that reads as a record.

A migration's title may span two lines, and node text reaches log messages (a hostname, an
error a node printed): with the line break kept, the second line would stand alone in the log,
a forged record for whoever reads or ships it.
"""

from __future__ import annotations

import json
import logging
import sys

from gpubot.cli.logs import TEXT_FORMAT, TextFormatter

FORGED = "node3 said: ok\n2026-12-06T10:00:00.000Z WARNING gpubot.audit: approved by U0ONCALL"


def _record(msg: str, exc: bool = False) -> logging.LogRecord:
    info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            info = sys.exc_info()
    return logging.LogRecord("gpubot.x", logging.WARNING, __file__, 1, msg, None, info)


def test_a_message_with_line_breaks_is_one_line() -> None:
    for text in (FORGED, "a\r\nb", "a\rb", "a\u2028b"):
        out = TextFormatter().format(_record(text))
        assert len(out.splitlines()) == 1, out
    assert (
        TextFormatter()
        .format(_record(FORGED))
        .endswith("ok 2026-12-06T10:00:00.000Z WARNING gpubot.audit: approved by U0ONCALL")
    )


def test_a_traceback_still_follows_its_line() -> None:
    out = TextFormatter().format(_record("failed\nbadly", exc=True)).splitlines()
    assert out[0].endswith("failed badly") and out[1].startswith("Traceback")


def test_control_the_plain_formatter_lets_a_message_forge_a_line() -> None:
    out = logging.Formatter(TEXT_FORMAT).format(_record(FORGED)).splitlines()
    assert len(out) == 2 and out[1].startswith("2026-12-06T10:00:00.000Z WARNING")


def test_a_block_follows_its_line_in_text_and_stays_in_the_json_message() -> None:
    from gpubot.cli.logs import JsonFormatter

    record = _record("SIGUSR1: what gpubot is waiting on")
    record.block = "--- thread 'MainThread'\n  File x"
    lines = TextFormatter().format(record).splitlines()
    assert lines[0].endswith("waiting on") and lines[1:] == ["--- thread 'MainThread'", "  File x"]
    doc = json.loads(JsonFormatter().format(record))
    assert doc["message"] == "SIGUSR1: what gpubot is waiting on\n--- thread 'MainThread'\n  File x"
