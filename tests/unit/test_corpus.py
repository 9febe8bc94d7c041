"""gpubot's parsers on real outputs published by others (tests/corpus/, sources in index.json).

Each sample is kept verbatim (any normalization is named in its entry) with the answer the sample
implies: the source's own expectation where it has one, else what the runtime's documentation
says. Wrong is the worst answer; ``other`` (or no record) is the answer for what nobody
documents or for text that is cut or not what the tool prints.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from gpubot.core import cgroup_shapes
from gpubot.core.enrich import Found, enrich_target, parse_enrichment, parse_scontrol
from gpubot.core.health.kernlog import parse_event
from gpubot.core.health.xid import Seen, xid_findings
from gpubot.core.models import GpuInfo, NodeSnapshot
from gpubot.core.probe.nvsmi import parse_apps, parse_gpus, take_notes
from gpubot.core.workload import (
    Workload,
    decide_owner,
    match_path,
    parse_cgroup,
    stop_command,
)
from gpubot.errors import ParseError
from tests.fixtures.corpus import CORPUS, INDEX, by_parser, text_of

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
)
_SOURCE = re.compile(r"[\w.-]+/[\w.-]+ \S+ @[0-9a-f]{40}( \(.+\))?|https://\S+( \(.+\))?")


def test_the_corpus_is_indexed_whole_with_its_sources() -> None:
    files = {str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*") if p.is_file()}
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
    return tuple(s for s in cgroup_shapes.SHAPES if not any(n in s[1].pattern for n in new))


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
