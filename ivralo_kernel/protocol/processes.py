"""[protocol] Small facts about processes and channels that several rooms state the same way: how
an exit is reported (the shell's 128 + signal convention), the ZMQ address of a kernel channel, and
who is whose child (one read of ``/proc``: the supervisor's tree kill and the host's watchdogs)."""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from typing import Any


def exit_code(waitstatus: int) -> int:
    """A ``waitpid`` status as a shell reports it: the exit status, or 128 + the signal."""
    if os.WIFSIGNALED(waitstatus):
        return 128 + os.WTERMSIG(waitstatus)
    return os.waitstatus_to_exitcode(waitstatus)


def from_returncode(returncode: int) -> int:
    """``subprocess``'s returncode (negative for a signal) as a shell reports it."""
    return returncode if returncode >= 0 else 128 - returncode


def describe_exit(code: int) -> str:
    """ "exited with status 1" or "was killed by signal SIGKILL", from a shell-style exit code."""
    if code > 128:
        try:
            return f"was killed by signal {signal.Signals(code - 128).name}"
        except ValueError:
            return f"was killed by signal {code - 128}"
    return f"exited with status {code}"


def channel_url(info: Mapping[str, Any], channel: str) -> str:
    """The ZMQ address of one channel of a connection file (tcp: ip:port; ipc: a file named ip-port)."""
    transport, ip, port = info.get("transport", "tcp"), info.get("ip", "127.0.0.1"), info[f"{channel}_port"]
    return f"{transport}://{ip}:{port}" if transport == "tcp" else f"{transport}://{ip}-{port}"


def children_by_parent(live_only: bool = False) -> dict[int, list[int]]:
    """Every process's children, from one read of each ``/proc/PID/stat`` (Linux; empty elsewhere).
    ``live_only``: zombies left out (they cannot be signalled again)."""
    children: dict[int, list[int]] = {}
    if not os.path.isdir("/proc/self"):
        return children
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # gone between listdir and open
            continue
        # The command name is in parentheses and may itself contain spaces or ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) < 2 or (live_only and fields[0] == b"Z"):
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def descendants_of(root: int, children: Mapping[int, list[int]]) -> list[int]:
    """``root``'s descendants in ``children`` (from ``children_by_parent``), breadth first, without
    ``root``; a pid reused between two reads cannot make it loop."""
    found: list[int] = []
    seen = {root}
    queue = [root]
    for pid in queue:  # grows as it goes
        for child in children.get(pid, ()):
            if child not in seen:
                seen.add(child)
                found.append(child)
                queue.append(child)
    return found
