"""[host] Look at a kernel's process tree from outside (psutil): snapshot it, and check what is left."""

from __future__ import annotations

import psutil


def tree_of(pid: int) -> list[int]:
    """``pid`` and all its live descendants (the supervisor adopts orphans, so this is the whole tree)."""
    try:
        root = psutil.Process(pid)
        return [pid, *(child.pid for child in root.children(recursive=True))]
    except psutil.Error:
        return []


def still_running(pids: list[int]) -> list[int]:
    """The pids that are still running (a zombie waiting to be reaped does not count)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.Error:
            continue
    return alive
