"""[supervisor] Find and end every descendant of this process.

``killpg`` misses children that called ``setsid()``; a snapshot of children misses double forks.
As a subreaper we are an ancestor of everything the kernel ever started, so walking ``/proc`` for
our descendants sees them all. Each round freezes what it finds (SIGSTOP) before killing, so a
process cannot fork a new child between being listed and being killed.
"""

from __future__ import annotations

import os
import signal
import time

from ivralo_kernel.protocol.processes import children_by_parent, descendants_of


def descendants(root: int) -> set[int]:
    """Live (non-zombie) descendants of ``root``."""
    return set(descendants_of(root, children_by_parent(live_only=True)))


def reap_children() -> list[tuple[int, int]]:
    """Collect every exited child without blocking; returns (pid, wait status) pairs."""
    reaped: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return reaped
        if pid == 0:
            return reaped
        reaped.append((pid, status))


def _signal_all(pids: set[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def kill_tree(root: int, budget_s: float = 2.0) -> list[tuple[int, int]]:
    """Freeze and kill every descendant of ``root`` (ourselves), and reap them. Returns what was reaped."""
    reaped: list[tuple[int, int]] = []
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        found = descendants(root)
        if not found:
            reaped += reap_children()
            if not descendants(root):
                break
            continue
        _signal_all(found, signal.SIGSTOP)
        # Anything forked before the stop landed shows up now; freeze until the set is stable.
        while True:
            more = descendants(root) - found
            if not more:
                break
            _signal_all(more, signal.SIGSTOP)
            found |= more
        _signal_all(found, signal.SIGKILL)
        reaped += reap_children()
        # Grandchildren are reparented to us as their parents die; give the kernel of the OS a
        # moment to do that before the next scan (bounded by the deadline above).
        time.sleep(0.002)
    reaped += reap_children()
    return reaped
