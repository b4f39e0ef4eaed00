"""[protocol] Small facts about processes and channels that several rooms state the same way: how
an exit is reported (the shell's 128 + signal convention) and the ZMQ address of a kernel channel."""

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
