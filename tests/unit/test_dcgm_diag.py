"""``dcgmi diag -j`` read per test and GPU: statuses, old and hostile documents, the argv, and
what is missing where DCGM is not (the recorded real documents: ``test_corpus.py``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpubot.core.health.diag import (
    MAX_MESSAGE,
    DiagUnreadable,
    diag_argv,
    missing,
    parse_diag,
)


def doc3(*results: dict[str, Any], name: str = "memory") -> str:
    """A DCGM 3.x document of one test with ``results``."""
    test = {"name": name, "results": list(results)}
    body = {"test_categories": [{"category": "Hardware", "tests": [test]}], "version": "3.3.1"}
    return json.dumps({"DCGM GPU Diagnostic": body})


def test_every_status_word_and_an_unknown_one_that_never_passes() -> None:
    words = ["Pass", "FAIL", "Warn", "Skip", "Not Run", "Inconclusive"]
    report = parse_diag(doc3(*({"gpu_id": str(i), "status": w} for i, w in enumerate(words))))
    assert [r.status for r in report.results] == ["pass", "fail", "warn", "skip", "skip", "unknown"]
    assert [report.verdict(i) for i in range(6)] == ["pass", "fail", "warn", "none", "none", "fail"]


def test_a_warn_carries_its_warnings_as_strings_or_objects() -> None:
    r = parse_diag(
        doc3(
            {"gpu_ids": "1", "status": "Warn", "warnings": ["Thermal violations totaling 2.0 s"]},
            {"gpu_ids": "2", "status": "Fail", "warnings": [{"warning": "a", "error_id": 5}, "b"]},
        )
    )
    assert [(x.gpu, x.message) for x in r.results] == [
        (1, "Thermal violations totaling 2.0 s"),
        (2, "a; b"),
    ]


def test_a_result_naming_no_gpu_is_about_every_gpu_and_other_entities_about_none() -> None:
    r = parse_diag(
        doc3(
            {"status": "Pass"},
            {"entity_group": "CPU", "entity_id": 0, "status": "Fail"},
        )
    )
    assert [(x.gpu, x.status) for x in r.results] == [(None, "pass")]
    assert r.verdict(7) == "pass"


def test_a_runtime_error_fails_the_run_in_one_line() -> None:
    text = json.dumps({"DCGM Diagnostic": {"runtime_error": "Unknown test\nname 'capoo_power'"}})
    r = parse_diag("Successfully ran diagnostic for group.\n" + text)
    assert r.runtime_error == "Unknown test name 'capoo_power'" and r.verdict(0) == "fail"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("", "empty"),
        ("Error: Unable to connect to host engine.", "not a dcgmi diag document"),
        ("{not json", "not JSON"),
        ("[1, 2]", "not a dcgmi diag document"),
        ('{"other": 1}', "none of"),
        ('{"DCGM Diagnostic": {"test_categories": {"a": 1}}}', "expected a list"),
        ('{"DCGM Diagnostic": {"test_categories": [7]}}', "expected an object"),
        ('{"DCGM Diagnostic": {}}', "neither test_categories nor runtime_error"),
        (doc3({"gpu_ids": "zero", "status": "Pass"}), "bad GPU id"),
        (doc3({"gpu_id": True, "status": "Pass"}), "neither a number nor text"),
        (doc3({"entity_id": -1, "status": "Pass"}), "bad GPU id"),
        (doc3({"gpu_ids": 1.5, "status": "Pass"}), "neither a number nor text"),
        ('{"a": ' + "[" * 100_000, "not JSON"),
        ("{" + " " * (4 * 1024 * 1024), "too long"),
    ],
    ids=lambda v: v[:20] if isinstance(v, str) else None,
)
def test_an_unreadable_document_is_one_line(text: str, said: str) -> None:
    with pytest.raises(DiagUnreadable) as err:
        parse_diag(text)
    line = str(err.value)
    assert said in line and "\n" not in line and len(line) < 300


def test_control_characters_and_huge_messages_are_made_one_short_line() -> None:
    evil = "\x1b[2J\rfake: PASS\n" + "x" * 100_000
    r = parse_diag(doc3({"gpu_id": "0", "status": "Fail", "warnings": [evil]}, name="a\x07b\nc"))
    (row,) = r.results
    assert row.test == "a b c" and row.message.startswith("[2J fake: PASS x")
    assert row.message.isprintable() and len(row.message) <= MAX_MESSAGE


def test_wrong_types_in_optional_places_read_as_nothing() -> None:
    text = doc3({"gpu_id": "0", "status": 3, "warnings": 7, "info": {"a": 1}})
    (row,) = parse_diag(text).results
    assert (row.status, row.message) == ("unknown", "")  # a number is no status: never a pass


def test_the_argv_is_bounded_and_checked() -> None:
    argv = diag_argv(2, 2, 600.0)
    assert argv == ["timeout", "-k", "5", "600", "dcgmi", "diag", "-r", "2", "-i", "2", "-j"]
    with pytest.raises(ValueError, match="level"):
        diag_argv(0, 3, 60.0)


# dcgmi's own words (NVIDIA/DCGM dcgmi/Command.cpp @72fa3fe) and timeout(1)'s / bash's.
@pytest.mark.parametrize(
    ("status", "output", "what"),
    [
        (127, "timeout: failed to run command 'dcgmi': No such file or directory", "dcgmi is not"),
        (127, "bash: line 1: dcgmi: command not found", "dcgmi is not"),
        (255, "Error: unable to establish a connection to the specified host: localhost", "nv-h"),
        (1, "Error: Unable to connect to host engine. Host engine connection invalid/dis", "nv-h"),
    ],
)
def test_what_is_missing_is_said(status: int, output: str, what: str) -> None:
    said = missing(status, output)
    assert said is not None and said.startswith(what)


def test_a_document_or_a_failed_test_is_nothing_missing() -> None:
    # control: a run that answered, even with a failure (exit 226 is DCGM's own), lacks nothing
    assert missing(226, doc3({"gpu_id": "0", "status": "Fail"})) is None
    assert missing(0, doc3({"gpu_id": "0", "status": "Pass"})) is None
