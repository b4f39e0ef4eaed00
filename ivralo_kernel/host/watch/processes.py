"""[host] Look at a kernel's process tree from outside (psutil): snapshot it, and check what is left."""

from __future__ import annotations

import os

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


def namespace_pids(pid: int) -> list[int]:
    """The process's pid in each pid namespace it is in, outermost first (``NSpid`` in its status)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return [int(x) for x in line.split()[1:]]
    except OSError:
        pass
    return [pid]


def host_pid(root: int, inner_pid: int) -> int | None:
    """The host's pid of the process in ``root``'s tree known as ``inner_pid`` inside its sandbox
    (a kernel reports ``os.getpid()``, which is its pid in the sandbox's own pid namespace)."""
    for pid in tree_of(root):
        nspids = namespace_pids(pid)
        if len(nspids) > 1 and nspids[-1] == inner_pid:
            return pid
    return None


def find_in_tree(root: int, module: str) -> int | None:
    """The first process of ``root``'s tree (breadth first) whose command line runs ``module``."""
    try:
        processes = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    except psutil.Error:
        return None
    for proc in processes:
        try:
            command = proc.cmdline()
            # bwrap's own processes carry the sandboxed command line as their arguments
            if module in command and os.path.basename(command[0]) != "bwrap":
                return int(proc.pid)
        except psutil.Error:
            continue
    return None


def tree_rss(pid: int | None) -> int | None:
    """Resident memory of a process and everything under it (what a warm spare holds while it waits)."""
    if pid is None:
        return None
    try:
        root = psutil.Process(pid)
        return int(sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]))
    except psutil.Error:
        return None
