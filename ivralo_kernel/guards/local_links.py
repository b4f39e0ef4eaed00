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
import socket
import struct

from ivralo_kernel.protocol.network.egress import is_loopback

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column
_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")


# sock_diag over netlink (what ``ss`` uses): the kernel walks only its listening sockets. Reading
# /proc/net/tcp walks every socket of the namespace, TIME_WAIT included: 9 ms with 1,200 of them
# here, per connect, and it grows with the machine's traffic.
_NETLINK_SOCK_DIAG = 4  # the netlink family (socket has no constant for it)
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST_DUMP = 0x1 | 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_TCP_LISTEN_BIT = 1 << 10
_NLMSG_HEADER = struct.Struct("=IHHII")
_DIAG_REQUEST = struct.Struct("=BBBBI48x")  # inet_diag_req_v2, with an empty inet_diag_sockid
_SPORT_AT, _INODE_AT = 4, 68  # in inet_diag_msg: id.idiag_sport (big-endian), idiag_inode


def _listening_inodes(port: int) -> set[str]:
    """Inodes of TCP sockets listening on ``port`` (any local address: loopback or wildcard)."""
    try:
        return _diag_listening_inodes(port)
    except OSError:
        return _proc_listening_inodes(port)  # netlink refused (a seccomp filter): the slow way


def _diag_listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(2.0)
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
            body = _DIAG_REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, _TCP_LISTEN_BIT)
            header = _NLMSG_HEADER.pack(
                _NLMSG_HEADER.size + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST_DUMP, seq, 0
            )
            nl.send(header + body)  # unaddressed: to the kernel (no connect, nothing for the guard)
            while _read_diag_batch(nl.recv(1 << 16), port, inodes):
                pass
    return inodes


def _read_diag_batch(data: bytes, port: int, inodes: set[str]) -> bool:
    """Adds the batch's matching inodes; False once the dump is done."""
    offset = 0
    while offset + _NLMSG_HEADER.size <= len(data):
        length, kind, _flags, _seq, _pid = _NLMSG_HEADER.unpack_from(data, offset)
        if kind == _NLMSG_DONE:
            return False
        if kind == _NLMSG_ERROR:
            raise OSError("sock_diag refused the request")
        message = offset + _NLMSG_HEADER.size
        if kind == _SOCK_DIAG_BY_FAMILY and struct.unpack_from(">H", data, message + _SPORT_AT)[0] == port:
            inodes.add(str(struct.unpack_from("=I", data, message + _INODE_AT)[0]))
        offset += (length + 3) & ~3
        if length < _NLMSG_HEADER.size:
            return False
    return True


def _proc_listening_inodes(port: int) -> set[str]:
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
        # port -> the listeners last found outside the tree. The same sockets stay outside: a process
        # cannot join the tree, so re-walking /proc (milliseconds on a busy machine) would only
        # repeat the answer. A socket handed into the tree later is judged, the safe direction.
        self._foreign: dict[int, set[str]] = {}

    def own(self, host: str, port: int | None) -> bool:
        if port is None or not is_loopback(host):
            return False
        listening = _listening_inodes(port)
        if not listening:
            return False
        if self._known.get(port) in listening:
            return True  # the same socket as before: no need to walk the tree again
        if self._foreign.get(port) == listening:
            return False
        for pid in _tree(self.root):
            inode = _held(pid, listening)
            if inode is not None:
                self._known[port] = inode
                return True
        self._foreign[port] = listening
        return False
