"""The nvidia-smi CSV parser: exact on real formats, ParseError on anything else."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpubot.core.models import ComputeApp, GpuInfo
from gpubot.core.nvsmi import (
    APP_FIELDS,
    GPU_FIELDS,
    apps_query_argv,
    gpu_query_argv,
    parse_apps,
    parse_gpus,
    smi_error,
)
from gpubot.errors import ParseError, SmiFailed, SmiMissing

U0 = "GPU-5f3c9a4e-1b2d-4c6e-8f00-0123456789ab"
U1 = "GPU-7a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
GPU_HEADER = "index, uuid, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%]"
APP_HEADER = "pid, gpu_uuid, used_gpu_memory [MiB]"
APP_HEADER_ALT = "pid, gpu_uuid, used_memory [MiB]"


def test_query_argv() -> None:
    assert gpu_query_argv("nvidia-smi") == [
        "nvidia-smi",
        "--query-gpu=index,uuid,name,memory.used,memory.total,utilization.gpu",
        "--format=csv,noheader,nounits",
    ]
    assert gpu_query_argv("/x/smi", [0, 3])[-2:] == ["-i", "0,3"]
    assert apps_query_argv("nvidia-smi") == [
        "nvidia-smi",
        "--query-compute-apps=pid,gpu_uuid,used_memory",
        "--format=csv,noheader,nounits",
    ]
    assert ",".join(GPU_FIELDS) in gpu_query_argv("s")[1]
    assert ",".join(APP_FIELDS) in apps_query_argv("s")[1]
    assert "process_name" not in " ".join(apps_query_argv("s"))  # the process's own say
    with pytest.raises(ValueError):
        gpu_query_argv("s", [])
    with pytest.raises(ValueError):
        gpu_query_argv("s", [-1])


@pytest.mark.parametrize(
    "text",
    [
        f"0, {U0}, NVIDIA H200, 1024, 143771, 37\n1, {U1}, NVIDIA H200, 0, 143771, 0\n",
        f"{GPU_HEADER}\n0, {U0}, NVIDIA H200, 1024 MiB, 143771 MiB, 37 %\n"
        f"1, {U1}, NVIDIA H200, 0 MiB, 143771 MiB, 0 %\n",
        f"{GPU_HEADER}\n0, {U0}, NVIDIA H200, 1024, 143771, 37\n1, {U1}, NVIDIA H200, 0, 143771, 0",
        f"\n0, {U0}, NVIDIA H200, 1024 MiB, 143771 MiB, 37 %\r\n"
        f"1, {U1}, NVIDIA H200, 0 MiB, 143771 MiB, 0 %\r\n\n",
    ],
    ids=["nounits", "units+header", "header+nounits", "crlf+blank"],
)
def test_parse_gpus_formats(text: str) -> None:
    assert parse_gpus(text) == (
        GpuInfo(0, U0, "NVIDIA H200", 1024, 143771, 37),
        GpuInfo(1, U1, "NVIDIA H200", 0, 143771, 0),
    )


@pytest.mark.parametrize("na", ["[N/A]", "[Not Supported]", "N/A", "[Unknown Error]"])
def test_unavailable_is_none_not_zero(na: str) -> None:
    (g,) = parse_gpus(f"0, {U0}, NVIDIA A100-SXM4-80GB, {na}, 81920, {na}")
    assert g.memory_used_mib is None and g.utilization_pct is None
    assert g.memory_total_mib == 81920
    (a,) = parse_apps(f"4242, {U0}, {na}")
    assert a.used_memory_mib is None


def test_gpu_name_with_comma_is_kept() -> None:
    (g,) = parse_gpus(f"0, {U0}, Odd, Name, 1, 2, 3")
    assert g.name == "Odd, Name" and (g.memory_used_mib, g.utilization_pct) == (1, 3)


def test_empty_output() -> None:
    assert parse_gpus("") == ()
    assert parse_apps("") == ()
    assert parse_apps(APP_HEADER + "\n") == ()  # --format=csv with no processes: header only
    assert parse_apps(APP_HEADER_ALT + "\n") == ()
    assert parse_apps("No running processes found\n") == ()


@pytest.mark.parametrize("header", [APP_HEADER, APP_HEADER_ALT])
def test_parse_apps_formats(header: str) -> None:
    text = f"{header}\n4242, {U0}, 1024 MiB\r\n\n77, {U1}, 2048 MiB\n"
    assert parse_apps(text) == (ComputeApp(4242, U0, 1024), ComputeApp(77, U1, 2048))
    # Header-less, unit-less form that gpubot asks for:
    assert parse_apps(f"4242, {U0}, 1024") == (ComputeApp(4242, U0, 1024),)


@pytest.mark.parametrize(
    "line",
    [
        "1949090, 0 MiB",  # the garbled interleaving of the simulated fault
        f"0, {U0}, NVIDIA H200, 1024, 143771",  # one field short
        f"x, {U0}, NVIDIA H200, 1024, 143771, 37",  # index not a number
        "0, not-a-uuid, NVIDIA H200, 1024, 143771, 37",
        f"0, {U0}, NVIDIA H200, -5, 143771, 37",
        f"0, {U0}, NVIDIA H200, 1024 GiB, 143771, 37",  # wrong unit
        f"0, {U0}, NVIDIA H200, 1024 MiB, 143771 MiB, 37 MiB",
        f"0, {U0}, , 1024, 143771, 37",  # empty name
        f"0, {U0}, NVIDIA H200, 0, 143771, 37 trailing",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
        "No devices were found",
    ],
)
def test_parse_gpus_rejects_with_raw_line(line: str) -> None:
    good = f"1, {U1}, NVIDIA H200, 0, 143771, 0"
    with pytest.raises(ParseError) as ei:
        parse_gpus(f"{good}\n{line}\n{good.replace('1,', '2,', 1)}")
    assert ei.value.line == line.strip()


def test_parse_gpus_rejects_duplicate_index() -> None:
    with pytest.raises(ParseError):
        parse_gpus(f"0, {U0}, A, 1, 2, 3\n0, {U1}, A, 1, 2, 3")


@pytest.mark.parametrize(
    "line",
    [
        "1949090, 0 MiB",
        f"4242, {U0}",  # one field short
        f"4242, {U0}, 1024, python3",  # the old 4-column form: a name is never parsed
        f"4242, {U0}, 1024, ",  # a trailing empty column is still a column
        f"4242, {U0}, 1024, /opt/my app, v2",  # a name's commas cannot shift the columns
        f"pid, {U0}, 1024",
        f"0, {U0}, 1024",  # pid 0 is no process
        f"-1, {U0}, 1024",
        "4242, GPU_bad, 1024",
        f"4242, {U0}, 1024 %",
        f"4242, {U0}, 1024 GiB",
        f"4242, {U0}, ",
        "pid, gpu_uuid, used_gpu_memory [MiB], process_name",  # the old header is no header
    ],
)
def test_parse_apps_rejects_with_raw_line(line: str) -> None:
    with pytest.raises(ParseError) as ei:
        parse_apps(f"1, {U1}, 5\n{line}")
    assert ei.value.line == line.strip()


@pytest.mark.parametrize(
    ("status", "output", "kind", "message"),
    [
        (0, "", None, None),
        (127, "sh: 1: nvidia-smi: not found", SmiMissing, "nvidia-smi not found"),
        (124, "", SmiFailed, "nvidia-smi hung: no answer in 5s"),
        (137, "", SmiFailed, "nvidia-smi hung: no answer in 5s"),
        (
            9,
            "\n  NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.\n\n",
            SmiFailed,
            "nvidia-smi failed (exit 9): NVIDIA-SMI has failed because it couldn't communicate",
        ),
        (
            6,
            "No devices were found",
            SmiFailed,
            "nvidia-smi failed (exit 6): No devices were found",
        ),
        (2, "", SmiFailed, "nvidia-smi failed (exit 2)"),
    ],
)
def test_smi_error(status: int, output: str, kind: type | None, message: str | None) -> None:
    err = smi_error("node3", status, output, timeout_s=5.0)
    if kind is None:
        assert err is None
        return
    assert type(err) is kind
    assert err is not None and err.node == "node3"
    assert message is not None and err.reason.startswith(message)
    assert "\n" not in str(err)


# ---- property tests -------------------------------------------------------------------------

_NAME_CHARS = st.characters(
    blacklist_categories=("Cc", "Cs", "Zl", "Zp"),
    blacklist_characters="\x1c\x1d\x1e\x85,",
)
_name = st.text(_NAME_CHARS, min_size=1, max_size=30).filter(lambda s: s == s.strip() and s)
_uuid = st.from_regex(
    r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", fullmatch=True
)
_mib = st.none() | st.integers(0, 10**9)
_NA = st.sampled_from(["[N/A]", "[Not Supported]", "N/A"])


@st.composite
def _gpu_tables(draw: st.DrawFn) -> tuple[tuple[GpuInfo, ...], str]:
    n = draw(st.integers(0, 6))
    gpus = tuple(
        GpuInfo(
            i,
            draw(_uuid),
            draw(_name),
            draw(_mib),
            draw(_mib),
            draw(st.none() | st.integers(0, 100)),
        )
        for i in range(n)
    )
    units = draw(st.booleans())
    header = draw(st.booleans())

    def val(v: int | None, unit: str) -> str:
        if v is None:
            return draw(_NA)
        return f"{v} {unit}" if units else str(v)

    lines = [GPU_HEADER] if header else []
    for g in gpus:
        lines.append(
            f"{g.index}, {g.uuid}, {g.name}, {val(g.memory_used_mib, 'MiB')}, "
            f"{val(g.memory_total_mib, 'MiB')}, {val(g.utilization_pct, '%')}"
        )
    return gpus, "\n".join(lines) + draw(st.sampled_from(["", "\n"]))


@st.composite
def _app_tables(draw: st.DrawFn) -> tuple[tuple[ComputeApp, ...], str]:
    apps = tuple(
        ComputeApp(draw(st.integers(1, 4_194_304)), draw(_uuid), draw(_mib))
        for _ in range(draw(st.integers(0, 6)))
    )
    units = draw(st.booleans())
    lines = [draw(st.sampled_from([APP_HEADER, APP_HEADER_ALT]))] if draw(st.booleans()) else []
    for a in apps:
        mem = draw(_NA) if a.used_memory_mib is None else (
            f"{a.used_memory_mib} MiB" if units else str(a.used_memory_mib)
        )  # fmt: skip
        lines.append(f"{a.pid}, {a.gpu_uuid}, {mem}")
    return apps, "\n".join(lines)


@given(_gpu_tables())
def test_gpus_round_trip(case: tuple[tuple[GpuInfo, ...], str]) -> None:
    gpus, text = case
    assert parse_gpus(text) == gpus


@given(_app_tables())
def test_apps_round_trip(case: tuple[tuple[ComputeApp, ...], str]) -> None:
    apps, text = case
    assert parse_apps(text) == apps


@given(st.text(max_size=400))
def test_random_text_parses_or_raises_parse_error(text: str) -> None:
    for parse in (parse_gpus, parse_apps):
        try:
            rows = parse(text)
        except ParseError as exc:
            assert isinstance(exc.line, str)
        else:
            assert isinstance(rows, tuple)


def _data_lines(text: str) -> int:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if lines and lines[0].split(",")[0].strip() in ("index", "pid"):  # a header, maybe mangled
        lines = lines[1:]
    return len(lines)


@st.composite
def _mangle(draw: st.DrawFn, text: str) -> str:
    """Delete, insert or replace characters, drop a comma, or cut the text short."""
    for _ in range(draw(st.integers(1, 3))):
        if not text:
            break
        i = draw(st.integers(0, len(text) - 1))
        op = draw(st.sampled_from(["del", "ins", "rep", "cut", "comma"]))
        c = draw(st.sampled_from([",", " ", "x", "9", "-", "\n", "[", "%", "MiB", "\x00", "é"]))
        if op == "del":
            text = text[:i] + text[i + 1 :]
        elif op == "ins":
            text = text[:i] + c + text[i:]
        elif op == "rep":
            text = text[:i] + c + text[i + 1 :]
        elif op == "cut":
            text = text[:i]
        else:
            text = text.replace(",", "", 1)
    return text


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mangled_output_parses_exactly_or_raises(data: st.DataObject) -> None:
    gpus, text = data.draw(_gpu_tables())
    bad = data.draw(_mangle(text))
    try:
        rows = parse_gpus(bad)
    except ParseError:
        return
    # If it parsed, no line was silently dropped, and every value is a whole count or None.
    assert len(rows) == _data_lines(bad)
    for g in rows:
        for v in (g.memory_used_mib, g.memory_total_mib, g.utilization_pct):
            assert v is None or (isinstance(v, int) and v >= 0)
    if bad == text:
        assert rows == gpus


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mangled_apps_parse_exactly_or_raise(data: st.DataObject) -> None:
    apps, text = data.draw(_app_tables())
    bad = data.draw(_mangle(text))
    try:
        rows = parse_apps(bad)
    except ParseError:
        return
    assert len(rows) == _data_lines(bad)
    assert all(a.pid > 0 for a in rows)
    for a in rows:
        assert a.used_memory_mib is None or (
            isinstance(a.used_memory_mib, int) and a.used_memory_mib >= 0
        )
    if bad == text:
        assert rows == apps
