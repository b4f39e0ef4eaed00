"""[guards] Is a loopback port served by this kernel's own tree? (Reads /proc; changes nothing.)

The kernel's processes talk to each other over loopback TCP: ipykernel's forwarding of a forked
child's output, the debugger (debugpy's adapter is a child process; pydevd connects to it), a local
Dask cluster. That is the kernel talking to itself, not reaching a host: nobody is asked about it.
A loopback port counts as the kernel's own when a process of the kernel's tree (the supervisor and
its descendants, which include reparented orphans: it is a subreaper) holds the socket listening on
it. A server of the person's on the same machine (``localhost:8000``) is not in the tree and is judged
like any host.
"""

from __future__ import annotations

import os

from ivralo_kernel.protocol.egress import is_loopback

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column
_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


def _listening_inodes(port: int) -> set[str]:
    """Inodes of TCP sockets listening on ``port`` (any local address: loopback or wildcard)."""
    suffix = f":{port:04X}"
    inodes: set[str] = set()
    for table in _TABLES:
        try:
            with open(table, encoding="ascii") as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    if len(fields) > 9 and fields[3] == _LISTEN and fields[1].endswith(suffix):
                        inodes.add(fields[9])
        except OSError:
            continue
    return inodes


def _tree(root: int) -> list[int]:
    """``root`` and its descendants, from /proc/<pid>/stat."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def _held(pid: int, sockets: set[str]) -> str | None:
    """The inode of one of ``sockets`` that ``pid`` holds open, if any."""
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return None
    for fd in fds:
        try:
            link = os.readlink(f"{fd_dir}/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in sockets:
            return link[8:-1]
    return None


class LocalLinks:
    """Answers "does a process of this kernel's tree listen on this loopback port?"."""

    def __init__(self, root: int) -> None:
        self.root = root
        self._known: dict[int, str] = {}  # port -> inode of our listener, as last seen

    def own(self, host: str, port: int | None) -> bool:
        if port is None or not is_loopback(host):
            return False
        listening = _listening_inodes(port)
        if not listening:
            return False
        if self._known.get(port) in listening:
            return True  # the same socket as before: no need to walk the tree again
        for pid in _tree(self.root):
            inode = _held(pid, listening)
            if inode is not None:
                self._known[port] = inode
                return True
        return False
