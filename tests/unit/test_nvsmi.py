"""The nvidia-smi CSV parser: exact on real formats, ParseError on anything else."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpubot.core.models import ComputeApp, GpuInfo
from gpubot.core.probe import nvsmi
from gpubot.core.probe.nvsmi import (
    APP_FIELDS,
    GPU_FIELDS,
    apps_query_argv,
    gpu_query_argv,
    normal_bus_id,
    parse_apps,
    parse_gpus,
    smi_error,
)
from gpubot.errors import ParseError, SmiFailed, SmiMissing

U0 = "GPU-5f3c9a4e-1b2d-4c6e-8f00-0123456789ab"
U1 = "GPU-7a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
B0 = "00000000:18:00.0"  # as nvidia-smi prints a PCI bus id: 8-digit domain, capitals
B1 = "00000000:2A:00.0"
GPU_HEADER = (
    "index, uuid, pci.bus_id, mig.mode.current, name, memory.used [MiB], memory.total [MiB], "
    "utilization.gpu [%]"
)
APP_HEADER = "pid, gpu_uuid, used_gpu_memory [MiB]"
APP_HEADER_ALT = "pid, gpu_uuid, used_memory [MiB]"


def test_query_argv() -> None:
    assert gpu_query_argv("nvidia-smi") == [
        "nvidia-smi",
        "--query-gpu=index,uuid,pci.bus_id,mig.mode.current,name,memory.used,memory.total,"
        "utilization.gpu",
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
        f"0, {U0}, {B0}, Disabled, NVIDIA H200, 1024, 143771, 37\n"
        f"1, {U1}, {B1}, Disabled, NVIDIA H200, 0, 143771, 0\n",
        f"{GPU_HEADER}\n0, {U0}, {B0}, Disabled, NVIDIA H200, 1024 MiB, 143771 MiB, 37 %\n"
        f"1, {U1}, {B1}, Disabled, NVIDIA H200, 0 MiB, 143771 MiB, 0 %\n",
        f"{GPU_HEADER}\n0, {U0}, {B0}, Disabled, NVIDIA H200, 1024, 143771, 37\n"
        f"1, {U1}, {B1}, Disabled, NVIDIA H200, 0, 143771, 0",
        f"\n0, {U0}, {B0}, Disabled, NVIDIA H200, 1024 MiB, 143771 MiB, 37 %\r\n"
        f"1, {U1}, {B1}, Disabled, NVIDIA H200, 0 MiB, 143771 MiB, 0 %\r\n\n",
    ],
    ids=["nounits", "units+header", "header+nounits", "crlf+blank"],
)
def test_parse_gpus_formats(text: str) -> None:
    assert parse_gpus(text) == (
        GpuInfo(0, U0, "NVIDIA H200", 1024, 143771, 37, bus_id=B0),
        GpuInfo(1, U1, "NVIDIA H200", 0, 143771, 0, bus_id=B1),
    )


@pytest.mark.parametrize("na", ["[N/A]", "[Not Supported]", "N/A", "[Unknown Error]"])
def test_unavailable_is_none_not_zero(na: str) -> None:
    (g,) = parse_gpus(f"0, {U0}, {B0}, {na}, NVIDIA A100-SXM4-80GB, {na}, 81920, {na}")
    assert g.memory_used_mib is None and g.utilization_pct is None
    assert g.memory_total_mib == 81920 and g.bus_id == B0
    (a,) = parse_apps(f"4242, {U0}, {na}")
    assert a.used_memory_mib is None


def test_gpu_name_with_comma_is_kept() -> None:
    (g,) = parse_gpus(f"0, {U0}, {B0}, Disabled, Odd, Name, 1, 2, 3")
    assert g.name == "Odd, Name" and (g.memory_used_mib, g.utilization_pct) == (1, 3)
    assert g.bus_id == B0


@pytest.mark.parametrize(
    "na", ["[N/A]", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]"]
)
def test_unavailable_bus_id_is_none(na: str) -> None:
    (g,) = parse_gpus(f"0, {U0}, {na}, Disabled, NVIDIA H200, 1024, 143771, 37")
    assert g.bus_id is None and g.name == "NVIDIA H200" and g.memory_used_mib == 1024
    assert g.minor is None  # nvidia-smi never says the minor: the probe finds it, or no one


@pytest.mark.parametrize(
    "bus",
    [
        "00000000:18:00.0",  # as printed: 8-digit domain, capitals
        "00000000:C1:00.0",
        "0000:c1:00.0",  # 4-digit domain, lower case: kept as printed too
        "00000001:AB:1F.7",
    ],
)
def test_bus_id_is_kept_as_printed(bus: str) -> None:
    (g,) = parse_gpus(f"3, {U0}, {bus}, Disabled, NVIDIA H200, 0, 143771, 0")
    assert g.bus_id == bus and g.index == 3


@pytest.mark.parametrize(
    ("bus", "normal"),
    [
        ("00000000:C1:00.0", "0000:c1:00.0"),  # nvidia-smi's form -> the /proc folder's name
        ("00000000:18:00.0", "0000:18:00.0"),
        ("00000001:AB:1F.7", "0001:ab:1f.7"),
        ("0000:c1:00.0", "0000:c1:00.0"),  # already normal: unchanged
        ("0000:C1:00.0", "0000:c1:00.0"),
        ("00001:c1:00.0", "0001:c1:00.0"),  # leading zeros beyond 4 digits go
        ("00010000:01:00.0", "10000:01:00.0"),  # a domain above ffff keeps all its digits
        ("10000:01:00.0", "10000:01:00.0"),  # e.g. a VMD domain: stays 5 digits
        ("FFFFFFFF:FF:1F.7", "ffffffff:ff:1f.7"),
        ("", None),
        ("[N/A]", None),
        ("N/A", None),
        ("C1:00.0", None),  # no domain
        ("000:c1:00.0", None),  # 3-digit domain
        ("000000000:C1:00.0", None),  # 9-digit domain
        ("00000000:C1:00", None),  # no function
        ("00000000:C1:00.8", None),  # function is 0-7
        ("00000000:G1:00.0", None),
        ("00000000:C1:0.0", None),  # device of one digit
        (" 00000000:C1:00.0", None),  # never trimmed: the parser strips, not this
        ("00000000:C1:00.0\n", None),
        ("00000000:C1:00.0/../../x", None),  # no path of any kind comes out of it
        ("0000:c1:00.0:", None),
    ],
)
def test_normal_bus_id(bus: str, normal: str | None) -> None:
    assert normal_bus_id(bus) == normal


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
        f"0, {U0}, {B0}, Disabled, NVIDIA H200, 1024, 143771",  # one field short
        f"0, {U0}, Disabled, NVIDIA H200, 1024, 143771, 37",  # the old 6-column form, no bus id
        f"0, {U0}, Odd, Name, 1, 2, 3",  # the old form with a comma in the name: "Odd" no bus id
        f"x, {U0}, {B0}, Disabled, NVIDIA H200, 1024, 143771, 37",  # index not a number
        f"0, not-a-uuid, {B0}, Disabled, NVIDIA H200, 1024, 143771, 37",
        f"0, {B0}, {U0}, Disabled, NVIDIA H200, 1024, 143771, 37",  # uuid and bus id swapped
        f"0, {U0}, {B0}, Disabled, NVIDIA H200, -5, 143771, 37",
        f"0, {U0}, {B0}, Disabled, NVIDIA H200, 1024 GiB, 143771, 37",  # wrong unit
        f"0, {U0}, {B0}, Disabled, NVIDIA H200, 1024 MiB, 143771 MiB, 37 MiB",
        f"0, {U0}, {B0}, , 1024, 143771, 37",  # empty name
        f"0, {U0}, 18:00.0, Disabled, NVIDIA H200, 1024, 143771, 37",  # bus id without a domain
        f"0, {U0}, 000:18:00.0, Disabled, NVIDIA H200, 1024, 143771, 37",  # domain of 3 digits
        f"0, {U0}, 000000000:18:00.0, Disabled, NVIDIA H200, 1024, 143771, 37",  # 9-digit domain
        f"0, {U0}, 00000000:18:00, Disabled, NVIDIA H200, 1024, 143771, 37",  # no function
        f"0, {U0}, 00000000:18:00.8, Disabled, NVIDIA H200, 1024, 143771, 37",  # function is 0-7
        f"0, {U0}, 00000000:1G:00.0, Disabled, NVIDIA H200, 1024, 143771, 37",  # not hex
        f"0, {U0}, 00000000:018:00.0, Disabled, NVIDIA H200, 1024, 143771, 37",  # bus of 3 digits
        f"0, {U0}, 00000000:18:00.0.1, Disabled, NVIDIA H200, 1024, 143771, 37",
        f"0, {U0}, , Disabled, NVIDIA H200, 1024, 143771, 37",  # an empty bus id is no placeholder
        f"0, {U0}, N/A, Disabled, NVIDIA H200, 1024, 143771, 37",  # placeholders are bracketed
        f"0, {U0}, 0, Disabled, NVIDIA H200, 1024, 143771, 37",
        f"0, {U0}, {B0}, Disabled, NVIDIA H200, 0, 143771, 37 trailing",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
        "No devices were found",
    ],
)
def test_parse_gpus_rejects_with_raw_line(line: str) -> None:
    good = f"1, {U1}, {B1}, Disabled, NVIDIA H200, 0, 143771, 0"
    with pytest.raises(ParseError) as ei:
        parse_gpus(f"{good}\n{line}\n{good.replace('1,', '2,', 1)}")
    assert ei.value.line == line.strip()


def test_parse_gpus_rejects_duplicate_index() -> None:
    with pytest.raises(ParseError):
        parse_gpus(f"0, {U0}, {B0}, A, 1, 2, 3\n0, {U1}, {B1}, A, 1, 2, 3")


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
_BUS_NA = st.sampled_from(["[N/A]", "[Not Supported]"])  # bracketed only, for a bus id
_bus = st.none() | st.from_regex(
    r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]", fullmatch=True
)


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
            bus_id=draw(_bus),
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
            f"{g.index}, {g.uuid}, {g.bus_id or draw(_BUS_NA)}, Disabled, {g.name}, "
            f"{val(g.memory_used_mib, 'MiB')}, "
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
        mem = (
            draw(_NA)
            if a.used_memory_mib is None
            else (f"{a.used_memory_mib} MiB" if units else str(a.used_memory_mib))
        )
        lines.append(f"{a.pid}, {a.gpu_uuid}, {mem}")
    return apps, "\n".join(lines)


@given(_gpu_tables())
def test_gpus_round_trip(case: tuple[tuple[GpuInfo, ...], str]) -> None:
    gpus, text = case
    assert parse_gpus(text) == gpus


@given(_bus.filter(lambda b: b is not None))
def test_normal_bus_id_is_lower_case_and_idempotent(bus: str) -> None:
    n = normal_bus_id(bus)
    assert n is not None and n == n.lower() and normal_bus_id(n) == n
    domain, rest = n.split(":", 1)
    assert len(domain) >= 4 and int(domain, 16) == int(bus.split(":", 1)[0], 16)
    assert rest == bus.split(":", 1)[1].lower()


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
        assert g.bus_id is None or normal_bus_id(g.bus_id) is not None  # valid, or none at all
        assert g.minor is None
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


# ---- real-format corpus: lost GPUs, infoROM warnings, bracketed values ---------------------------
# Each sample is shaped as its public source quotes it; the numbers and uuids are made up.
ROW0 = f"0, {U0}, 00000000:18:00.0, Disabled, NVIDIA H200, 10, 143771, 5"
ROW2 = "2, GPU-6f3c9a4e-1b2d-4c6e-8f00-0123456789ab, 00000000:34:00.0, Disabled, H200, 0, 1, 0"
CORPUS = [
    # A monitoring tool's tests quoting the older driver shape: bus id glued to "GPU".
    (
        "Unable to determine the device handle for GPU0000:CB:00.0: Unknown Error",
        15,
        (None, "0000:CB:00.0"),
    ),
    # A public bug thread (driver 610, 4-GPU box): index, then bus id.
    (
        "Unable to determine the device handle for GPU1: 0000:34:00.0: Unknown Error",
        15,
        (1, "0000:34:00.0"),
    ),
    # A public GPU-failure write-up: index only.
    ("Unable to determine the device handle for GPU1: Unknown Error", 15, (1, None)),
]


@pytest.mark.parametrize(("line", "status", "lost"), CORPUS)
def test_a_lost_gpu_line_leaves_the_others_listed(
    line: str, status: int, lost: tuple[int | None, str | None]
) -> None:
    for out, err in ((f"{line}\n{ROW0}\n{ROW2}\n", ""), (f"{ROW0}\n{ROW2}\n", line + "\n")):
        gpus, notes = nvsmi.parse_gpu_answer("n", status, out, err)
        assert [(i, b) for i, b, _ in notes.lost] == [lost]
        assert "is lost" in notes.lines()[0]
        listed = {g.index: g for g in gpus}
        assert listed[0].memory_used_mib == 10 and listed[2].flags == ()
        if lost[0] is not None:
            assert listed[lost[0]].flags == ("lost",) and listed[lost[0]].memory_used_mib is None


def test_an_inforom_warning_keeps_the_rows_and_flags_its_gpu() -> None:
    # nvidia-smi(1), RETURN VALUE 14: "infoROM is corrupted"; the warning names the GPU's bus.
    warn = "WARNING: infoROM is corrupted at gpu 0000:18:00.0"
    gpus, notes = nvsmi.parse_gpu_answer("n", 14, f"{warn}\n{ROW0}\n{ROW2}\n", "")
    assert [g.flags for g in gpus] == [("warning",), ()]
    assert notes.lines() == (warn,)


@pytest.mark.parametrize("status", [9, 255, 15, 14])
def test_a_failure_without_rows_is_still_a_failure(status: int) -> None:
    with pytest.raises(SmiFailed):
        nvsmi.parse_gpu_answer("n", status, "NVIDIA-SMI has failed because ...\n", "")


@pytest.mark.parametrize(
    ("value", "flag"),
    [
        ("[GPU is lost]", "lost"),
        ("[GPU requires reset]", "requires-reset"),
        ("[Unknown Error]", "unknown-error"),
        ("[No data]", "no-data"),
        ("[Timeout]", "timeout"),
        ("[N/A]", None),
        ("[Some new words]", None),
    ],
)
def test_any_bracketed_value_is_none_with_a_flag_where_it_says_something(
    value: str, flag: str | None
) -> None:
    line = (
        f"3, GPU-5f3c9a4e-1b2d-4c6e-8f00-0123456789ab, 00000000:18:00.0, Disabled, X, {value}, 1, 2"
    )
    (g,) = nvsmi.parse_gpus(line)
    assert g.memory_used_mib is None and g.flags == ((flag,) if flag else ())


@pytest.mark.parametrize(("mig", "flags"), [("Enabled", ("mig",)), ("Disabled", ()), ("[N/A]", ())])
def test_a_gpu_in_mig_mode_is_flagged(mig: str, flags: tuple[str, ...]) -> None:
    (g,) = parse_gpus(f"0, {U0}, {B0}, {mig}, NVIDIA A100-SXM4-80GB, 5, 81920, 0")
    assert g.flags == flags and g.memory_used_mib == 5
    with pytest.raises(ParseError):
        parse_gpus(f"0, {U0}, {B0}, Maybe, NVIDIA A100-SXM4-80GB, 5, 81920, 0")
