"""``gpubot console`` on a real pseudo-terminal: readline's line editing and history, Ctrl-C at
the prompt drops the line at once (and twice on an empty line leaves), Ctrl-D leaves with 0, and
Ctrl-C while a command runs still stops the console with 130 (``gpubot.console.terminal``)."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpubot.console.repl import PROMPT
from gpubot.console.terminal import GOODBYE, LEAVE_HINT
from gpubot.store import open_store

REPO = Path(__file__).resolve().parents[2]
LEFT, UP, CTRL_C, CTRL_D = b"\x1b[D", b"\x1b[A", b"\x03", b"\x04"
NODE1 = re.compile(rb"== node1 \xc2\xb7 4 \xc3\x97")
NODE2 = re.compile(rb"== node2 \xc2\xb7 4 \xc3\x97")
ANSWERED = re.compile(NODE2.pattern + rb"(?s:.*)\n" + re.escape(PROMPT.encode()))  # then a prompt


class Terminal:
    """``gpubot console`` with a pseudo-terminal for its controlling terminal (so ``\\x03`` is
    SIGINT), and what it has written so far."""

    def __init__(self, config: Path) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLACK_", "GPUBOT_"))}
        env["TERM"] = "xterm"
        argv = [sys.executable, "-m", "gpubot", "--config", str(config), "console"]
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: become gpubot at once (nothing else runs after a fork)
            try:
                os.chdir(REPO)
                os.execve(sys.executable, argv, env)
            finally:
                os._exit(127)
        self.seen = b""
        self.code: int | None = None

    def read_until(self, pattern: bytes | re.Pattern[bytes], timeout: float = 60) -> float:
        """Read until ``pattern`` appears in what is new; return the seconds it took."""
        start = time.monotonic()
        mark = len(self.seen)
        found = re.compile(re.escape(pattern)) if isinstance(pattern, bytes) else pattern
        while not found.search(self.seen, mark):
            left = start + timeout - time.monotonic()
            assert left > 0, f"no {found.pattern!r} in {self.seen[mark:][-800:]!r}"
            if not self._read(min(left, 1.0)):
                assert found.search(self.seen, mark), f"ended: {self.seen[mark:][-800:]!r}"
        return time.monotonic() - start

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return True
        try:
            chunk = os.read(self.fd, 65536)
        except OSError:  # the child ended and the terminal closed
            return False
        self.seen += chunk
        return bool(chunk)

    def ready(self) -> None:
        """Return once readline waits for a key at an empty prompt.

        readline shows the prompt, then sets the terminal up and only then waits: a Ctrl-C in
        between is taken but acted on only at the next key (CPython's readline checks signals
        when its select() is interrupted). A key echoed back and erased says it waits now; a
        person's Ctrl-C comes far later than a test's would.
        """
        self.type(b"x")
        self.read_until(b"x")
        self.type(b"\x7f")  # erase it: the line is empty again
        self.read_until(b"\x08")
        time.sleep(0.2)  # readline ends its redraw and goes back to its select()
        self._read(0.1)

    def type(self, keys: bytes) -> None:
        """Type ``keys`` at the terminal."""
        self.mark = len(self.seen)
        os.write(self.fd, keys)

    def wait(self, timeout: float = 60) -> int:
        """Read what is left and return the exit status."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                while self._read(0.2) and time.monotonic() < deadline:
                    pass
                self.code = os.waitstatus_to_exitcode(status)
                return self.code
            self._read(0.2)
        raise AssertionError(f"still running: {self.seen[-800:]!r}")

    def close(self) -> None:
        """Kill the child by its pid if it is still running; close the terminal."""
        if self.code is None and os.waitpid(self.pid, os.WNOHANG) == (0, 0):
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        os.close(self.fd)


@pytest.fixture
def config(slack_fleet: Any, tmp_path: Path) -> Path:
    """The Slack fleet's config with an audit database of the test's own."""
    url = f"sqlite:///{tmp_path}/audit.db"
    init = open_store(url, check_schema=False)
    init.upgrade()
    init.close()
    text = slack_fleet.config_path.read_text()
    start = text.index('url = "', text.index("[database]"))
    cfg = tmp_path / "gpubot.toml"
    cfg.write_text(text[:start] + f'url = "{url}"' + text[text.index("\n", start) :])
    return cfg


@pytest.fixture
def term(config: Path) -> Iterator[Terminal]:
    t = Terminal(config)
    try:
        t.read_until(PROMPT.encode())  # the banner, then the first prompt
        t.ready()
        yield t
    finally:
        t.close()


def test_ctrl_c_drops_the_line_at_once_and_the_edited_line_runs(term: Terminal) -> None:
    assert b"gpubot console as " in term.seen
    term.type(b"status node1")
    term.read_until(b"status node1")  # echoed by readline
    time.sleep(0.2)  # readline goes back to its select() (see ``ready``)
    term.type(CTRL_C)
    took = term.read_until(b"\n" + PROMPT.encode())  # a fresh prompt, without Enter
    assert took < 5
    term.type(b"statu node2" + LEFT * 6 + b"s\r")  # "statu| node2": the s goes in the middle
    term.read_until(ANSWERED)  # keys typed while a command runs are the terminal's, not readline's
    term.type(UP + b"\r")  # the history: the last line again
    term.read_until(ANSWERED)
    term.type(CTRL_D)
    assert term.wait() == 0
    assert not NODE1.search(term.seen)  # the dropped line never ran
    assert term.seen.rstrip().endswith(GOODBYE.encode())
    assert b"Traceback" not in term.seen


def test_two_ctrl_c_on_an_empty_line_leave_with_0(term: Terminal) -> None:
    term.type(CTRL_C)
    term.read_until(LEAVE_HINT.encode())
    term.type(b"help\r")  # a line typed in between: the next Ctrl-C starts again
    term.read_until(re.compile(rb"/gpu status(?s:.*)\n" + re.escape(PROMPT.encode())))
    term.ready()
    term.type(CTRL_C)
    term.read_until(
        re.compile(re.escape(LEAVE_HINT.encode()) + rb"\r?\n" + re.escape(PROMPT.encode()))
    )
    term.ready()
    term.type(CTRL_C)
    assert term.wait() == 0
    tail = term.seen.decode().replace("\r", "").rstrip().splitlines()
    assert tail[-1] == GOODBYE and b"Traceback" not in term.seen


def test_ctrl_c_while_a_command_runs_stops_the_console_with_130(
    term: Terminal, slack_fleet: Any
) -> None:
    node2 = slack_fleet.node("node2")
    node2.set_fault("slow", delay_s=30)
    try:
        term.type(b"status node2\r")
        term.read_until(b"status node2\r\n")
        time.sleep(1.0)  # the command is under way: nvidia-smi answers in 30 s
        term.type(CTRL_C)
        assert term.wait(timeout=30) == 130
    finally:
        node2.set_fault(None)
    assert b"gpubot: interrupted" in term.seen and b"Traceback" not in term.seen
    assert not NODE2.search(term.seen)
