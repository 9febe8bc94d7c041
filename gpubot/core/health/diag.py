"""``dcgmi diag -r 1|2 -i N -j``: the argv gpubot runs, and its JSON read per test and per GPU.

Two document shapes exist (both in ``tests/corpus/diag``):

- DCGM 2.x/3.x: ``{"DCGM GPU Diagnostic": {"test_categories": [{"category", "tests": [{"name",
  "results": [{"gpu_ids": "0,1,2,3" | "gpu_id": "0", "status", "warnings", "info"}]}]}]}}``;
  a warning is an object (``{"warning": …, "error_id": …}``) or, in old releases, a string.
- DCGM 4.x: ``{"DCGM Diagnostic": {"test_categories": […]}, "entity_groups": […], "metadata":
  {"version": …, "Driver Version Detected": …}}``; a result names ``entity_group`` ("GPU") and
  ``entity_id``; each test has a ``test_summary``; a run that could not start says so in
  ``runtime_error``.

A status is one of pass, fail, warn, skip; any other word is ``unknown`` and never reads as a
pass. A document that cannot be read raises ``DiagUnreadable`` (one line). Messages are made one
line, stripped of control characters and cut.

DCGM's GPU id: DCGM enumerates GPUs through NVML, in NVML's order, which is ``nvidia-smi``'s
index, so ``-i N`` is the GPU ``nvidia-smi`` (and gpubot) calls N. ``dcgmi discovery -l`` shows
DCGM's ids beside each bus id and UUID where one doubts it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpubot.core.text import cut

LEVELS = {"quick": 1, "medium": 2}  # gpubot's word → dcgmi's run level (-r)
MAX_DOC = 4 * 1024 * 1024  # characters of one document read
MAX_MESSAGE = 300  # characters kept of one result's message
MAX_RESULTS = 2000  # rows read from one document
KILL_AFTER_S = 5  # timeout -k: SIGKILL this long after the SIGTERM at the limit
ROOTS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")  # 4.x, then 2.x/3.x
_STATUS = {
    "pass": "pass",
    "fail": "fail",
    "warn": "warn",
    "warning": "warn",
    "skip": "skip",
    "skipped": "skip",
    "not run": "skip",
}

# dcgmi's own words when it cannot reach nv-hostengine (NVIDIA/DCGM dcgmi/Command.cpp @72fa3fe).
NO_HOSTENGINE = (
    "unable to establish a connection to the specified host",
    "unable to connect to host engine",
)
EXIT_TIMEOUT = (124, 137)  # timeout(1): the limit reached (137: killed after -k)
EXIT_NOT_FOUND = 127  # timeout(1) or the shell: the program was not found


class DiagUnreadable(ValueError):
    """The document is not a ``dcgmi diag -j`` result gpubot can read (one line)."""


@dataclass(frozen=True)
class DiagResult:
    """One test's result on one GPU (``gpu`` None: the result names no GPU, so all)."""

    category: str
    test: str
    gpu: int | None
    status: str  # pass | fail | warn | skip | unknown
    message: str  # its warnings (else ""), one line

    def to_dict(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "test": self.test,
            "gpu": self.gpu,
            "status": self.status,
            "message": self.message,
        }


@dataclass(frozen=True)
class DiagReport:
    """A ``dcgmi diag -j`` document as read."""

    results: tuple[DiagResult, ...]
    version: str | None = None
    driver: str | None = None
    runtime_error: str | None = None

    def for_gpu(self, gpu: int) -> tuple[DiagResult, ...]:
        """Return the results about ``gpu`` (those naming no GPU included)."""
        return tuple(r for r in self.results if r.gpu is None or r.gpu == gpu)

    def verdict(self, gpu: int) -> str:
        """Return fail, warn, pass, or ``none`` (nothing ran that judged the GPU)."""
        mine = self.for_gpu(gpu)
        if self.runtime_error is not None or any(r.status in ("fail", "unknown") for r in mine):
            return "fail"
        if any(r.status == "warn" for r in mine):
            return "warn"
        return "pass" if any(r.status == "pass" for r in mine) else "none"


def diag_argv(gpu: int, level: int, timeout_s: float) -> list[str]:
    """Return the argv that runs level ``level`` on GPU ``gpu``, bounded by ``timeout_s``."""
    if level not in LEVELS.values():
        raise ValueError(f"diag level must be one of {sorted(LEVELS.values())}, not {level!r}")
    limit = max(1, int(timeout_s))
    bound = ["timeout", "-k", str(KILL_AFTER_S), str(limit)]
    return [*bound, "dcgmi", "diag", "-r", str(level), "-i", str(int(gpu)), "-j"]


def missing(exit_status: int, output: str) -> str | None:
    """Return what is missing for DCGM on the node, from a run's exit and words (None: it ran)."""
    low = output.lower()
    if exit_status == EXIT_NOT_FOUND or (
        "dcgmi" in low and ("no such file" in low or "not found" in low) and "{" not in output
    ):
        return "dcgmi is not installed (DCGM is missing: install datacenter-gpu-manager)"
    if any(w in low for w in NO_HOSTENGINE) and "{" not in output:
        return "nv-hostengine is not running (start it: systemctl start nvidia-dcgm)"
    return None


def clean(text: str, most: int = MAX_MESSAGE) -> str:
    """Return ``text`` as one line of printable characters, cut to ``most``."""
    one = " ".join("".join(c if c.isprintable() else " " for c in text[: most * 4]).split())
    return cut(one, most)


def parse_diag(text: str) -> DiagReport:
    """Read a ``dcgmi diag -j`` document (text before its first ``{`` is skipped: a banner)."""
    if len(text) > MAX_DOC:
        raise DiagUnreadable(f"the answer is too long to be read ({len(text)} characters)")
    start = text.find("{")
    if start < 0:
        raise DiagUnreadable(f"not a dcgmi diag document: {clean(text, 120) or 'empty'}")
    try:
        doc = json.loads(text[start:])
    except (ValueError, RecursionError) as exc:
        raise DiagUnreadable(f"not JSON: {clean(str(exc), 120)}") from None
    if not isinstance(doc, dict):
        raise DiagUnreadable("not a dcgmi diag document: the JSON is not an object")
    key = next((k for k in ROOTS if k in doc), None)
    if key is None:
        raise DiagUnreadable(
            f"not a dcgmi diag document: none of {', '.join(map(repr, ROOTS))} in it"
        )
    body = _object(doc[key], key)
    meta = doc.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    version = _text(meta.get("version", body.get("version")))
    driver = _text(meta.get("Driver Version Detected", body.get("Driver Version Detected")))
    runtime = body.get("runtime_error")
    runtime_error = clean(str(runtime)) if runtime not in (None, "") else None
    cats = body.get("test_categories", [])
    if runtime_error is None and "test_categories" not in body:
        raise DiagUnreadable(f"{key!r} holds neither test_categories nor runtime_error")
    results: list[DiagResult] = []
    for i, cat in enumerate(_list(cats, "test_categories")):
        c = _object(cat, f"test_categories[{i}]")
        category = clean(_text(c.get("category")) or "?", 40)
        for j, test in enumerate(_list(c.get("tests", []), f"{category}.tests")):
            results.extend(_test(category, _object(test, f"{category}.tests[{j}]")))
            if len(results) > MAX_RESULTS:
                raise DiagUnreadable(f"more than {MAX_RESULTS} results: not read")
    return DiagReport(tuple(results), version, driver, runtime_error)


def _test(category: str, t: Mapping[str, Any]) -> list[DiagResult]:
    name = clean(_text(t.get("name")) or "?", 60)
    rows = _list(t.get("results", []), f"{name}.results")
    out: list[DiagResult] = []
    for k, row in enumerate(rows):
        r = _object(row, f"{name}.results[{k}]")
        for gpu in _gpus(r, f"{name}.results[{k}]"):
            out.append(DiagResult(category, name, gpu, _status(r.get("status")), _message(r)))
    if not rows:  # no per-GPU row: the test's summary speaks for all
        summary = t.get("test_summary")
        if isinstance(summary, dict) and "status" in summary:
            out.append(DiagResult(category, name, None, _status(summary["status"]), ""))
    return out


def _gpus(r: Mapping[str, Any], where: str) -> list[int | None]:
    """Return the GPUs a result is about ([None]: it names none)."""
    if "entity_id" in r:
        group = r.get("entity_group", "GPU")
        if group != "GPU":
            return []  # a CPU's or a switch's result: not about a GPU
        return [_index(r["entity_id"], where)]
    raw = r.get("gpu_ids", r.get("gpu_id"))
    if raw is None:
        return [None]
    if isinstance(raw, int) and not isinstance(raw, bool):
        return [_index(raw, where)]
    if isinstance(raw, str):
        parts = [p.strip() for p in raw.split(",") if p.strip()]
        return [_index(p, where) for p in parts] or [None]
    raise DiagUnreadable(f"{where}: a GPU id is neither a number nor text")


def _index(value: object, where: str) -> int:
    if isinstance(value, bool):
        raise DiagUnreadable(f"{where}: a GPU id is not a number")
    try:
        n = int(value) if isinstance(value, int | str) else -1
    except ValueError:
        n = -1
    if not 0 <= n <= 4095:
        raise DiagUnreadable(f"{where}: bad GPU id {clean(repr(value), 20)}")
    return n


def _status(value: object) -> str:
    word = value.strip().lower() if isinstance(value, str) else ""
    return _STATUS.get(word, "unknown")


def _message(r: Mapping[str, Any]) -> str:
    warnings = r.get("warnings", [])
    if isinstance(warnings, str | dict):
        warnings = [warnings]
    said: list[str] = []
    if isinstance(warnings, list):
        for w in warnings[:20]:
            if isinstance(w, dict):
                w = w.get("warning")
            if isinstance(w, str) and w.strip():
                said.append(w)
    return clean("; ".join(said))


def _object(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise DiagUnreadable(f"{clean(where, 60)}: expected an object")
    return value


def _list(value: object, where: str) -> Sequence[Any]:
    if not isinstance(value, list):
        raise DiagUnreadable(f"{clean(where, 60)}: expected a list")
    return value


def _text(value: object) -> str | None:
    return clean(value, 60) if isinstance(value, str) and value.strip() else None
