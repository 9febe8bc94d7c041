"""The simulated driver: notices the death of every registered GPU process the moment it happens.

A real driver frees a context when the process's device files close at exit. The simulation
records that moment (``died_at``) so that memory is released exactly ``release_delay_s`` later:
one thread polls a pidfd per live allocation (``os.pidfd_open``) and discovers new allocations
by watching each node's ``state.json``. ``nvidia-smi`` itself records "now" for a death nobody
saw (when no driver runs), so the state never lies, it is only less precise.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections.abc import Callable

from gpusim import simstate

Key = tuple[str, int, int]  # (state dir, pid, start ticks)
ORPHAN_SWEEP_S = 0.5


class Driver:
    """Watch the allocations of some nodes and record each death under the node's lock."""

    def __init__(
        self, state_dirs: list[str], reap: Callable[[int], None], interval_s: float = 0.05
    ) -> None:
        self._dirs = list(state_dirs)
        self._reap = reap
        self._interval_ms = max(1, int(interval_s * 1000))
        self._watched: dict[int, Key] = {}  # pidfd -> allocation
        self._children: dict[int, int] = {}  # pidfd -> pid of a child to reap once it exits
        self._keys: set[Key] = set()
        self._seen: dict[str, tuple[int, int, int]] = {}
        self._pending: list[Key] = []
        self._pending_children: list[int] = []
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._stop = threading.Event()
        self._zombies: set[int] = set()
        self._next_sweep = 0.0
        self._thread = threading.Thread(target=self._run, name="gpusim-driver", daemon=True)

    def start(self) -> None:
        """Start watching in a background thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop watching and close every pidfd."""
        self._stop.set()
        os.write(self._wake_w, b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for fd in [*self._watched, *self._children]:
            os.close(fd)
        self._watched.clear()
        self._children.clear()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def watch(self, state_dir: str, pid: int, ticks: int) -> None:
        """Watch one process now, without waiting for the next look at the state file."""
        with self._lock:
            self._pending.append((state_dir, pid, ticks))
        self._wake()

    def watch_child(self, pid: int) -> None:
        """Reap our child ``pid`` as soon as it exits (a supervisor, an sshd, a workload)."""
        with self._lock:
            self._pending_children.append(pid)
        self._wake()

    def _wake(self) -> None:
        if not self._stop.is_set():  # after stop() the pipe is closed
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        while not self._stop.is_set():
            for key in self._discover():
                self._add(poller, key)
            with self._lock:
                kids, self._pending_children = self._pending_children, []
            for pid in kids:
                try:
                    fd = os.pidfd_open(pid)
                except OSError:
                    self._reap(pid)
                    continue
                self._children[fd] = pid
                poller.register(fd, select.POLLIN)
            events = poller.poll(self._interval_ms)
            now = time.time()
            dead: list[Key] = []
            for fd, _ in events:
                if fd == self._wake_r:
                    while True:
                        try:
                            if not os.read(self._wake_r, 512):
                                break
                        except BlockingIOError:
                            break
                    continue
                child = self._children.pop(fd, None)
                if child is not None:
                    poller.unregister(fd)
                    os.close(fd)
                    self._reap(child)
                    continue
                alloc = self._watched.pop(fd, None)
                if alloc is not None:
                    poller.unregister(fd)
                    os.close(fd)
                    dead.append(alloc)
            self._record(dead, now)
            if time.monotonic() >= self._next_sweep:
                self._next_sweep = time.monotonic() + ORPHAN_SWEEP_S
                self._reap_orphans()

    def _reap_orphans(self) -> None:
        """Reap zombies adopted by this process (a child subreaper) that nobody else waits for.

        A process whose parent died comes to us (an sshd session's command, a killed shell's
        child). Only zombies in another session than ours, seen on two sweeps in a row, are
        taken: a child that other code forked and waits for is reaped by that code at once.
        """
        mine = os.getsid(0)
        seen: set[int] = set()
        try:
            tasks = os.listdir("/proc/self/task")
        except OSError:
            return
        for tid in tasks:
            try:
                with open(f"/proc/self/task/{tid}/children", encoding="ascii") as f:
                    kids = [int(p) for p in f.read().split()]
            except (OSError, ValueError):
                continue
            for pid in kids:
                st = _state_and_session(pid)
                if st is None or st[0] != "Z" or st[1] == mine:
                    continue
                if pid in self._zombies:
                    self._reap(pid)
                else:
                    seen.add(pid)
        self._zombies = seen

    def _discover(self) -> list[Key]:
        """Return allocations that are not watched yet (state files that changed, and requests)."""
        with self._lock:
            found, self._pending = self._pending, []
        for d in self._dirs:
            try:
                st = os.stat(os.path.join(d, simstate.STATE_FILE))
            except FileNotFoundError:
                continue
            sig = (st.st_ino, st.st_mtime_ns, st.st_size)
            if self._seen.get(d) == sig:
                continue
            self._seen[d] = sig
            try:
                state = simstate.load(d)  # replaced atomically: readable without the lock
            except (OSError, ValueError):
                self._seen.pop(d, None)
                continue
            found += [
                (d, a["pid"], a["start_ticks"]) for a in state["allocs"] if a.get("died_at") is None
            ]
        return [k for k in found if k not in self._keys]

    def _add(self, poller: select.poll, key: Key) -> None:
        _, pid, ticks = key
        self._keys.add(key)
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone already
            self._record([key], time.time())
            return
        if simstate.start_ticks(pid) != ticks:  # the pid belongs to another process now
            os.close(fd)
            self._record([key], time.time())
            return
        self._watched[fd] = key
        poller.register(fd, select.POLLIN)  # readable once the process has exited

    def _record(self, dead: list[Key], when: float) -> None:
        by_dir: dict[str, list[Key]] = {}
        for key in dead:
            by_dir.setdefault(key[0], []).append(key)
        for d, keys in by_dir.items():
            wanted = {(pid, ticks) for _, pid, ticks in keys}
            try:
                with simstate.transaction(d) as state:
                    for a in state["allocs"]:
                        if (a["pid"], a["start_ticks"]) in wanted and a.get("died_at") is None:
                            a["died_at"] = when
            except OSError:
                pass  # the fleet is being torn down
        for key in dead:
            self._keys.discard(key)
            self._reap(key[1])


def _state_and_session(pid: int) -> tuple[str, int] | None:
    """Return the state letter and session id of ``pid``, or None."""
    rest = simstate.stat_fields(pid)
    if rest is None:
        return None
    return rest[3 - 3].decode(), int(rest[6 - 3])
