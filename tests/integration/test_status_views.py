"""``gpubot status`` for a large fleet, run as a real subprocess over the simulated fleet: one
line per node above ``[cli] summary_above`` (or ``--summary``), the tables with ``--tables``,
``--watch`` redrawing over one app until SIGTERM, Ctrl-C or a closed pipe, labelled columns,
commands cut at their end, and the same table text from the CLI and the console."""

from __future__ import annotations

import os
import pty
import queue
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpubot.cli import EXIT_SIGPIPE
from gpubot.cli.status import CLEAR_ALL as CLEAR_ALL_TEXT
from gpubot.cli.status import CLEAR_BELOW as CLEAR_BELOW_TEXT
from gpubot.cli.status import HOME as HOME_TEXT
from gpubot.core.text_table import GPU_HEADER, SUMMARY_HEADER
from gpusim.fleet import SimFleet

HOME, CLEAR_ALL, CLEAR_BELOW = (c.encode() for c in (HOME_TEXT, CLEAR_ALL_TEXT, CLEAR_BELOW_TEXT))
HEADING = re.compile(r"^Every 0\.3 s: gpubot status · \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")


def _with(text: str, extra: str, ssh: str = "") -> str:
    """Return the fleet's settings with ``ssh`` keys and ``extra`` tables."""
    text = re.sub(r"(?m)^(known_hosts = .*)$", lambda m: m[1] + "\n" + ssh, text, count=1)
    return text + "\n" + extra


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimFleet]:
    with SimFleet(tmp_path_factory.mktemp("views"), nodes=3, gpus=2, release_delay_s=0.2) as f:
        base = f.config_path.read_text()
        f.config_path.with_name("few.toml").write_text(_with(base, "[cli]\nsummary_above = 2\n"))
        f.config_path.with_name("many.toml").write_text(_with(base, ""))  # the default: 8
        # nvidia-smi is called hung 2 s before the command timeout
        f.config_path.with_name("quick.toml").write_text(_with(base, "", "command_timeout_s = 4"))
        n1 = f.node("node1")
        n1.spawn(gpu=0, mib=2048, name="python3")
        n1.spawn(gpu=0, mib=1024, name="python3")
        yield f


def config(fleet: SimFleet, name: str) -> str:
    return str(fleet.config_path.with_name(name))


def gpubot(cfg: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GPUBOT_CONFIG", "NO_COLOR")}
    return subprocess.run(
        [sys.executable, "-m", "gpubot", "--config", cfg, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def header_of(columns: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile(r"^ *" + r" {2,}".join(re.escape(c) for c in columns) + "$", re.M)


SUMMARY, TABLE = header_of(SUMMARY_HEADER), header_of(GPU_HEADER)


def test_above_the_setting_one_line_per_node(fleet: SimFleet) -> None:
    p = gpubot(config(fleet, "few.toml"), "status")  # 3 nodes, summary_above = 2
    assert p.returncode == 0, p.stderr
    assert SUMMARY.search(p.stdout) and not TABLE.search(p.stdout), p.stdout
    rows = {ln.split()[0]: ln.split() for ln in p.stdout.splitlines()[1:4]}
    assert sorted(rows) == ["node1", "node2", "node3"]
    assert rows["node1"][1] == "1/2" and rows["node1"][-2:] == ["2", "ok"]  # 2 holders
    assert rows["node2"][1] == "0/2" and rows["node2"][-2:] == ["0", "ok"]
    assert "3/3 nodes answered" in p.stdout
    # --tables overrides the setting; the default setting (8) shows 3 nodes as tables
    for cfg, args in (("few.toml", ("--tables",)), ("many.toml", ())):
        t = gpubot(config(fleet, cfg), "status", *args)
        assert TABLE.search(t.stdout) and not SUMMARY.search(t.stdout), (cfg, t.stdout)
    s = gpubot(config(fleet, "many.toml"), "status", "--summary")
    assert SUMMARY.search(s.stdout) and not TABLE.search(s.stdout), s.stdout
    both = gpubot(config(fleet, "many.toml"), "status", "--summary", "--tables")
    assert both.returncode == 2 and "not allowed with" in both.stderr


def test_the_summary_says_why_a_node_did_not_answer(fleet: SimFleet) -> None:
    fleet.stop_server("node2")
    fleet.node("node3").set_fault("hang")  # reachable, but nvidia-smi never answers
    try:
        p = gpubot(config(fleet, "quick.toml"), "status", "--summary")
    finally:
        fleet.start_server("node2")
        fleet.node("node3").set_fault(None)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    lines = {ln.split()[0]: ln for ln in p.stdout.splitlines() if ln.startswith("node")}
    assert list(lines) == ["node1", "node2", "node3"]  # in the settings' order
    assert re.search(r"^node2 +\? .* unreachable: cannot connect", lines["node2"]), lines
    assert re.search(r"^node3 +\? .* failed: nvidia-smi hung", lines["node3"]), lines
    assert lines["node1"].endswith(" ok")


def test_labelled_columns_and_commands_cut_at_their_end(fleet: SimFleet) -> None:
    w = fleet.node("node1").spawn(gpu=1, mib=512, name="python3")
    try:
        raw = Path(f"/proc/{w.pid}/cmdline").read_bytes()
        p = gpubot(config(fleet, "many.toml"), "status", "node1")
        assert p.returncode == 0, p.stderr
    finally:
        os.kill(w.pid, signal.SIGKILL)
    head = next(ln for ln in p.stdout.splitlines() if TABLE.match(ln))
    mem = head.index("MEM %") + len("MEM %")
    row = next(ln for ln in p.stdout.splitlines() if f" {w.pid} 512 MiB " in ln)
    assert re.fullmatch(r" *\d+%", row[:mem].split("  ")[-1]), row  # right under its label
    cell = row[head.index("PROCESSES") :].split("  ")[0]
    program, *args = raw.decode().rstrip("\0").split("\0")
    whole = " ".join([f"{w.user} {w.pid} 512 MiB {Path(program).name}", *args])
    assert len(whole) > len(cell) and cell.endswith("…"), cell
    assert whole.startswith(cell[:-1]), (cell, whole)  # its start kept, its end cut


def test_the_cli_and_the_console_print_the_same_table(fleet: SimFleet) -> None:
    cfg = config(fleet, "many.toml")
    cli = gpubot(cfg, "status", "node1", "--tables")
    console = gpubot(cfg, "console", "-c", "/gpu status node1")
    assert cli.returncode == 0 and console.returncode == 0, cli.stderr + console.stderr

    def table(text: str) -> list[str]:  # the header, GPU 0 and its second process, GPU 1
        lines = text.splitlines()
        start = next(i for i, ln in enumerate(lines) if TABLE.match(ln))
        assert not re.match(r"^ +\S", lines[start + 4]), lines  # no row of the table after
        return lines[start : start + 4]

    assert table(cli.stdout) == table(console.stdout)
    assert table(cli.stdout)[2].startswith(" " * 20)  # a further process: the GPU cells blank


class Reader:
    """Lines of a child's stdout, read in a thread, with a deadline for each wait."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        assert proc.stdout is not None
        out = proc.stdout
        threading.Thread(target=self._pump, args=(out,), daemon=True).start()

    def _pump(self, out: object) -> None:
        for line in out:  # type: ignore[attr-defined]
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def until_frames(self, n: int, timeout: float = 45.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while sum(bool(HEADING.match(ln)) for ln in self.seen) < n:
            line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, self.seen
            self.seen.append(line)
        return self.seen


def watch(cfg: str, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "GPUBOT_CONFIG"}
    argv = [sys.executable, "-m", "gpubot", "--config", cfg, "status", *args, "--watch", "0.3"]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def node_connections(pid: int, port: int) -> set[int]:
    """Local ports of ``pid``'s established TCP connections to 127.0.0.1:``port``."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with_target = os.readlink(fd) if fd.is_symlink() else ""
        if m := re.fullmatch(r"socket:\[(\d+)\]", with_target):
            inodes.add(m[1])
    found = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        local, remote, state, inode = f[1], f[2], f[3], f[9]
        if inode in inodes and state == "01" and remote == f"0100007F:{port:04X}":
            found.add(int(local.split(":")[1], 16))
    return found


def test_watch_redraws_over_one_app_until_sigterm(fleet: SimFleet) -> None:
    proc = watch(config(fleet, "few.toml"))
    try:
        reader = Reader(proc)
        reader.until_frames(2)
        first = node_connections(proc.pid, fleet.node("node1").port)
        reader.until_frames(4)
        again = node_connections(proc.pid, fleet.node("node1").port)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert len(first) == 1 and first == again  # one SSH connection, kept from frame to frame
    frames = "\n".join(reader.seen).split("\n\nEvery ")  # frames follow after an empty line
    assert len(frames) == 4 and all(SUMMARY.search(f) for f in frames[:3]), reader.seen
    assert "\033[" not in "\n".join(reader.seen)  # no cursor moves off a terminal


def test_watch_ends_on_ctrl_c_with_130(fleet: SimFleet) -> None:
    proc = watch(config(fleet, "many.toml"), "node1")
    try:
        Reader(proc).until_frames(2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "Traceback" not in err, err


def test_watch_into_a_closed_pipe_ends_with_141(fleet: SimFleet) -> None:
    proc = watch(config(fleet, "few.toml"))
    try:
        assert proc.stdout is not None
        assert HEADING.match(proc.stdout.readline())  # one line read, then the reader goes
        proc.stdout.close()
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == EXIT_SIGPIPE and "Traceback" not in err, err


def test_watch_on_a_terminal_redraws_in_place(fleet: SimFleet) -> None:
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("GPUBOT_CONFIG", "NO_COLOR")}
    argv = ["status", "--summary", "--watch", "0.3"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpubot", "--config", config(fleet, "many.toml"), *argv],
        stdout=slave,
        stderr=subprocess.PIPE,
        env=env,
    )
    os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + 45
        while seen.count(HOME) < 3 and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 1.0)
            if ready:
                seen += os.read(master, 65536)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    assert proc.returncode == 0 and b"Traceback" not in err, err
    assert seen.count(HOME) >= 3, seen[-500:]  # each frame drawn from the top left corner
    assert seen.count(CLEAR_ALL) == 1  # the screen cleared once: then each line over the last
    frames = seen.split(HOME)[1:3]
    assert all(f.rstrip().endswith(CLEAR_BELOW) for f in frames)  # what the last left, gone
    assert all(b"NODE" in f and b"node3" in f for f in frames)
