"""gpubot's parsers on real outputs published by others (tests/corpus/, sources in index.json).

Each sample is kept verbatim (any normalization is named in its entry) with the answer the sample
implies: the source's own expectation where it has one, else what the runtime's documentation
says. Wrong is the worst answer; ``other`` (or no record) is the answer for what nobody
documents or for text that is cut or not what the tool prints.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from gpubot.core import workload
from gpubot.core.enrich import enrich_target, parse_enrichment
from gpubot.core.health.diag import parse_diag
from gpubot.core.health.kernlog import parse_event
from gpubot.core.health.xid import Seen, xid_findings
from gpubot.core.models import GpuInfo, NodeSnapshot
from gpubot.core.probe.nvsmi import parse_apps, parse_gpus, take_notes
from gpubot.core.runtimes.base import Found
from gpubot.core.runtimes.slurm import parse_scontrol
from gpubot.core.workload import (
    Workload,
    decide_owner,
    match_path,
    parse_cgroup,
    stop_command,
)
from gpubot.errors import ParseError
from tests.fixtures.corpus import CORPUS, INDEX, by_parser, text_of
from tests.fixtures.prometheus import dcgm_truth

PARSERS = (
    "cgroup",
    "cgroup_path",
    "docker",
    "podman",
    "crictl",
    "scontrol",
    "nvsmi_notes",
    "nvsmi_apps",
    "health_q",
    "nvlink",
    "xid",
    "dcgm_diag",
    "dcgm_metrics",
)
# repository path @commit, a URL, or (where the public code index that held a file did not name
# its repository) that index's id of the file, with what the file is
_SOURCE = re.compile(
    r"[\w.-]+/[\w.-]+ \S+ @[0-9a-f]{40}( \(.+\))?|https://\S+( \(.+\))?"
    r"|code-search id \d+ \(.+\)"
)


def test_the_corpus_is_indexed_whole_with_its_sources() -> None:
    # slurm/ keeps its own index (its README.md), checked whole by tests/unit/test_slurm_parse.py
    files = {
        str(p.relative_to(CORPUS))
        for p in CORPUS.rglob("*")
        if p.is_file() and p.relative_to(CORPUS).parts[0] != "slurm"
    }
    indexed = [s["file"] for s in INDEX]
    assert len(indexed) == len(set(indexed))
    assert files - {"index.json", "README.md"} == set(indexed)
    assert len(INDEX) >= 25 and {s["parser"] for s in INDEX} == set(PARSERS)
    for s in INDEX:
        assert _SOURCE.fullmatch(s["source"]), s["source"]
        assert s["implies"] and isinstance(s["expect"], dict)


def workload_of(sample: dict[str, Any]) -> Workload | None:
    text = text_of(sample)
    if sample["parser"] == "cgroup":
        return parse_cgroup(text)
    path = text.rstrip("\n")
    prefix, suffix = sample.get("strip_prefix", ""), sample.get("strip_suffix", "")
    assert path.startswith(prefix) and path.endswith(suffix)
    return match_path(path[len(prefix) : len(path) - len(suffix)])


@pytest.mark.parametrize("sample", by_parser("cgroup", "cgroup_path"))
def test_cgroup_samples(sample: dict[str, Any]) -> None:
    want = sample["expect"]
    w = workload_of(sample)
    if want["kind"] == "none":
        assert w is None
        return
    assert w is not None and w.kind == want["kind"]
    if "id" in want:
        assert w.id == want["id"]
    assert want.get("detail", {}).items() <= dict(w.detail).items()
    if "reason" in want:
        assert (w.get("reason") or "").startswith(want["reason"])
    if "owner" in want:
        assert decide_owner(w, {}, "owner").owner == (want["owner"] or None)
    if "stop" in want:
        assert stop_command(w) == (want["stop"] or None)
    if "lookup" in want:
        assert enrich_target(w) == (tuple(want["lookup"]) or None)


def _before_the_fix() -> tuple[tuple[str, re.Pattern[str]], ...]:
    """The shapes without the rules of issue 21 that the ``before`` answers predate."""
    new = ("reason_daemon", r"\.slice:", "kubelet", "sluid")
    return tuple(s for s in workload.SHAPES if not any(n in s[1].pattern for n in new))


@pytest.mark.parametrize(
    "sample", [p for p in by_parser("cgroup", "cgroup_path") if "before" in p.values[0]]
)
def test_control_these_samples_were_answered_wrong_before(sample: dict[str, Any]) -> None:
    """Control: with issue 21's rules removed, the sample gets the wrong answer its entry records
    (a runtime's unit to stop, the outer container, ``other``); with them, it does not."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("gpubot.core.workload.SHAPES", _before_the_fix())
        mp.setattr("gpubot.core.workload._nest", lambda outer, inner: outer)
        old = workload_of(sample)
    assert old is not None
    before = sample["before"]
    if before.startswith("service "):
        unit = before.split(" ")[1].rstrip(",")
        assert (old.kind, old.id, stop_command(old)) == ("service", unit, f"systemctl stop {unit}")
    elif before.startswith("docker container "):
        assert old.kind == "docker" and old.id.startswith(before.split(" ")[2])
    else:
        assert before.startswith("other") and old.kind == "other"
    new = workload_of(sample)
    assert new is not None and (new.kind, new.id) != (old.kind, old.id)


def _check_found(found: Found, want: dict[str, Any]) -> None:
    for key in ("name", "image", "restart", "namespace", "pod", "pod_uid"):
        if key in want:
            assert getattr(found, key) == (want[key] or None), key
    assert want.get("labels", {}).items() <= dict(found.labels).items()


@pytest.mark.parametrize("sample", by_parser("docker", "podman", "crictl"))
def test_inspect_samples(sample: dict[str, Any]) -> None:
    want = sample["expect"]
    got = parse_enrichment(sample["parser"], text_of(sample), want["ids"])
    if want.get("found") is False:
        assert got == {}
        return
    assert set(got) == set(want["ids"])
    _check_found(got[want["ids"][0]], want)


@pytest.mark.parametrize("sample", by_parser("scontrol"))
def test_scontrol_samples(sample: dict[str, Any]) -> None:
    """Each sample is framed the way the lookup script frames scontrol's output."""
    want = sample["expect"]
    job = want["job"]
    stdout = f"\n@gpubot-job {job}\n{text_of(sample).rstrip(chr(10))}\n\n@gpubot-end\n"
    got = parse_scontrol(stdout, [job])
    if want.get("found") is False:
        assert got == {}
        return
    found = got[job]
    want_found = (want["name"], want["user"], want["uid"], want["state"])
    assert (found.name, found.user, found.uid, found.state) == want_found


@pytest.mark.parametrize("sample", by_parser("nvsmi_notes"))
def test_nvidia_smi_lost_gpu_lines(sample: dict[str, Any]) -> None:
    want = sample["expect"]
    rest, notes = take_notes(text_of(sample))
    assert [["" if i is None else str(i), b or "", why] for i, b, why in notes.lost] == want["lost"]
    if want.get("table") == "ParseError":
        with pytest.raises(ParseError):
            parse_gpus(rest)
    else:
        assert rest.strip() == "" and parse_gpus(rest) == ()
        assert all("needs a GPU reset or a reboot" in line for line in notes.lines())


@pytest.mark.parametrize("sample", by_parser("nvsmi_apps"))
def test_nvidia_smi_other_tables_are_refused(sample: dict[str, Any]) -> None:
    assert sample["expect"]["error"] == "ParseError"
    with pytest.raises(ParseError):
        parse_apps(text_of(sample))


@pytest.mark.parametrize("sample", by_parser("xid"))
def test_kernel_log_xid_lines(sample: dict[str, Any]) -> None:
    """Every Xid/SXid line of a real log, and only those, with the next step it implies: the
    sample's GPUs are given the bus ids its lines name (as nvidia-smi writes them)."""
    want = sample["expect"]
    events = [e for e in map(parse_event, text_of(sample).splitlines()) if e is not None]
    assert [[e.sxid, e.code, e.bus, e.pid, e.name] for e in events] == want["events"]
    buses = sorted({e.bus for e in events if not e.sxid})
    gpus = tuple(
        GpuInfo(i, f"GPU-{i}", "GPU", 0, 1, 0, bus_id=f"0000{b[:4]}:{b[5:7]}:{b[8:10]}.0")
        for i, b in enumerate(buses)
    )
    snap = NodeSnapshot("n", 0.0, gpus)
    seen = [Seen("n", e, 100.0) for e in events]
    found = xid_findings(seen, {"n": snap}, now=100.0, window_s=3600.0)
    got = sorted([f.gpu is not None, f.key.holder, f.next_step] for f in found)
    assert got == want["findings"]


def diag_document(sample: dict[str, Any]) -> str:
    """Return the sample as a whole ``dcgmi diag -j`` document (a quoted test object is put in
    one, as its entry's ``normalized`` says)."""
    text = text_of(sample)
    if not sample["file"].endswith(".txt"):
        return text
    test = text.rstrip().removesuffix(",")
    category = {"category": "Hardware", "tests": ["TEST"]}
    shell = json.dumps({"DCGM Diagnostic": {"test_categories": [category]}})
    return shell.replace('"TEST"', test)


@pytest.mark.parametrize("sample", by_parser("dcgm_diag"))
def test_dcgm_diag_documents(sample: dict[str, Any]) -> None:
    """Per test and per GPU: each status, the message of each failed or skipped test."""
    want = sample["expect"]
    report = parse_diag(diag_document(sample))
    gpu = want["gpu"]
    mine = report.for_gpu(gpu)
    assert report.version == want.get("version")
    assert len(mine) == want["rows"]
    statuses: dict[str, int] = {}
    for r in mine:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    assert statuses == want["statuses"]
    assert [[r.test, r.message] for r in mine if r.status == "fail"] == want["failed"]
    skipped = [[r.test, r.message] for r in mine if r.status == "skip" and r.message]
    assert skipped == want["skipped_with_reason"]
    assert report.verdict(gpu) == want["verdict"]
    assert {str(g): report.verdict(int(g)) for g in want["other_verdicts"]} == want[
        "other_verdicts"
    ]


@pytest.mark.parametrize("sample", by_parser("dcgm_metrics"))
def test_dcgm_exporter_samples_read_by_brute_force(sample: dict[str, Any]) -> None:
    # The reference the Prometheus tests compare gpubot's PromQL summary with
    # (tests/integration/test_prometheus.py): it must say what the sample says.
    assert dcgm_truth(text_of(sample)) == sample["expect"]
