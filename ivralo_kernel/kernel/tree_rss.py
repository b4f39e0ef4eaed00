"""[kernel] The RSS of the kernel and its descendants, read cheaply enough for every cell.

Read at each cell's end (and by the effects' sampler), so its cost is on each reply's way: the first
version opened ``statm`` and every thread's ``children`` file by path, and each ``open`` inside the
kernel goes through the guards' audit hooks, 550 us a reading with ipykernel's 12 threads (two
readings: most of the effects report's 1.1 ms). Here the kernel's own files stay open and are read
with ``pread`` (no audit event, about 1 us each); only the thread list is listed again each time
(one ``listdir``), a new thread's ``children`` file is opened once, and the processes below the
kernel (rare: a cell that started one) are read by path as before.

Most cells start no process, and a kernel with no child has nothing below it to read: one
``waitid(P_ALL, WNOHANG | WNOWAIT)`` says so (ECHILD) without reaping anything, and the thread list
and the threads' ``children`` files are read only when a child exists. At a cell's end the caches
are cold (the kernel slept while the client and the host ran): the full reading cost a median
177 us of CPU there (47 us in a loop), the one syscall a few.

A thread id reused by a new thread while its old file is still held reads as "no children" until
the next reading drops it: ids are reused only after the pid space wraps (``pid_max``).
"""

from __future__ import annotations

import contextlib
import os
import threading

PAGE = os.sysconf("SC_PAGE_SIZE")


class TreeRss:
    """``read()``: bytes of RSS of this process and every descendant (any thread may call it)."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._statm = -1
        self._children: dict[str, int] = {}  # thread id -> its open ``children`` file

    def read(self) -> int:
        with self._lock:
            total = self._own()
            for pid in self._own_children():
                total += _subtree_rss(pid)
            return total

    def close(self) -> None:
        with self._lock:
            for fd in [self._statm, *self._children.values()]:
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self._statm, self._children = -1, {}

    def _own(self) -> int:
        for _ in range(2):  # once more with a fresh file if code in the kernel closed ours
            try:
                if self._statm < 0:
                    self._statm = os.open(f"/proc/{self._pid}/statm", os.O_RDONLY | os.O_CLOEXEC)
                return int(os.pread(self._statm, 128, 0).split()[1]) * PAGE
            except (OSError, ValueError, IndexError):
                self._statm = -1
        return 0

    def _own_children(self) -> list[int]:
        try:  # any thread's child, running or ended; WNOWAIT: its owner still waits for it
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return []
        try:
            threads = os.listdir(f"/proc/{self._pid}/task")
        except OSError:
            return []
        for gone in self._children.keys() - set(threads):
            with contextlib.suppress(OSError):
                os.close(self._children.pop(gone))
        pids: list[int] = []
        for tid in threads:
            data = self._pread_children(tid)
            if data:
                pids += [int(c) for c in data.split()]
        return pids

    def _pread_children(self, tid: str) -> bytes:
        for _ in range(2):
            fd = self._children.get(tid, -1)
            try:
                if fd < 0:
                    fd = self._children[tid] = os.open(
                        f"/proc/{self._pid}/task/{tid}/children", os.O_RDONLY | os.O_CLOEXEC
                    )
                return os.pread(fd, 1 << 16, 0)
            except OSError:
                self._children.pop(tid, None)  # ended, or its file was closed under us: once more
        return b""


def _subtree_rss(root: int) -> int:
    """RSS of ``root`` and its descendants, by path (``/proc/PID/task/*/children``)."""
    total, stack, seen = 0, [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        try:
            with open(f"/proc/{pid}/statm", "rb") as statm:
                total += int(statm.read().split()[1]) * PAGE
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children", "rb") as children:
                    stack += [int(c) for c in children.read().split()]
        except (OSError, ValueError, IndexError):
            continue
    return total
