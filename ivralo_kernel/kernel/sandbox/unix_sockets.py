"""[kernel] No unix socket of the machine is reachable from the kernel's tree, wherever it lives.

The sandbox empties ``/tmp``, ``/run`` and ``$XDG_RUNTIME_DIR``, but a socket anywhere else it shows
(a tmux server under ``TMUX_TMPDIR``, an agent under ``$HOME``, a daemon's folder under ``/opt``)
would still answer a ``connect``: a read-only mount does not stop one. So once the kernel's own
Jupyter sockets are bound (the only unix sockets it makes; the egress proxy's is the supervisor's,
which stays outside this filter), a seccomp filter refuses every new AF_UNIX socket, in every
thread of this process (TSYNC) and in every process it starts. A stream ``socketpair`` still works
(a connected pair reaches nothing); a datagram one is refused (its ends can ``sendto`` a path), and
TCP on loopback works.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ivralo_kernel.protocol.sandbox import seccomp

HEARTBEAT_BIND_TIMEOUT_S = 10.0
_POLL_S = 0.005


def _heartbeat_socket(app: Any) -> str | None:
    """The heartbeat's ipc socket file, which ipykernel binds in the heartbeat's own thread (so
    perhaps not yet when the app is built); None over TCP."""
    if getattr(app, "transport", "tcp") != "ipc":
        return None
    ip, port = getattr(app, "ip", ""), getattr(app, "hb_port", 0)
    return f"{ip}-{port}" if ip and port else None


def _bound_here(path: str) -> bool:
    """Whether a socket of this process is bound to ``path`` (a file left there by a kernel before
    this one does not count): its inode among our descriptors and, with that path, in the table of
    unix sockets."""
    ours = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            ours.add(link[8:-1])
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="replace") as table:
            for line in table:
                fields = line.split()
                if len(fields) >= 8 and fields[7] == path and fields[6] in ours:
                    return True
    except OSError:
        return os.path.exists(path)
    return False


def _wait_until_bound(path: str) -> bool:
    deadline = time.monotonic() + HEARTBEAT_BIND_TIMEOUT_S
    while time.monotonic() < deadline:
        if _bound_here(path):
            return True
        time.sleep(_POLL_S)  # polling a condition under a deadline: ZMQ's thread gives no signal
    return False


def close_unix_sockets(app: Any) -> str:
    """Install the filter; returns what the layer report says."""
    arch = seccomp.this_arch()
    if arch is None:
        return "open: no seccomp filter for this architecture (x86_64 and aarch64 only)"
    heartbeat = _heartbeat_socket(app)
    late = ""
    if heartbeat is not None and not _wait_until_bound(heartbeat):
        # The filter goes in anyway: a heartbeat that cannot bind shows as a dead kernel, which the
        # host reports; no filter would be a hole nobody sees.
        late = f" (the heartbeat's socket was not bound within {HEARTBEAT_BIND_TIMEOUT_S:g} s)"
    try:
        seccomp.install(seccomp.unix_socket_filter(arch), arch, all_threads=True)
    except seccomp.SeccompUnavailable as exc:
        return f"open: {exc}"
    return "closed: no new AF_UNIX socket (seccomp, every thread and every child)" + late
