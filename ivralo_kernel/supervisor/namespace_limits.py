"""[supervisor] Lower the sandbox's own namespace limits before the kernel starts, then give up the
capability that could raise them again.

Inotify instances and watches are counted per user in every user namespace from the sandbox's up
to the machine's (ucounts): 125 instances held in a sandbox left the host's same-user processes
with EMFILE, because the machine's limit (128) is the user's, shared with the host. Each user
namespace also has a limit of its own (``/proc/sys/user/*``, INT_MAX in a new one), which its root
may lower with CAP_SYS_RESOURCE; a charge must fit under every limit on the way up, so a nested
namespace cannot undo it. The sandbox's IPC namespace is private too: System V shared memory a
process attached, filled and detached is held by no process, so no RSS shows it
(``/proc/sys/kernel/shm*``, ``msg*``: the same capability lowers them).

bwrap gives the supervisor CAP_SYS_RESOURCE for this alone (``--cap-add``); the supervisor writes
the numbers the host chose, then drops the capability from every set (bounding, ambient, its own),
so neither it nor anything it starts can raise them again (nor raise an rlimit's hard cap).
"""

from __future__ import annotations

import ctypes
import os
import sys

# Only these files, under /proc/sys: a name from anywhere else is refused.
ALLOWED = frozenset(
    {
        "user/max_inotify_instances",
        "user/max_inotify_watches",
        "kernel/shmall",
        "kernel/shmmax",
        "kernel/shmmni",
        "kernel/msgmni",
        "kernel/msgmnb",
    }
)
CAP_SYS_RESOURCE = 24
# bwrap gives every other capability up (``--cap-drop ALL``), this one with CAP_SYS_RESOURCE: dropping
# a capability from the bounding set takes it. It goes last, and the same way.
CAP_SETPCAP = 8
GIVEN = (CAP_SYS_RESOURCE, CAP_SETPCAP)
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAP_VERSION_3 = 0x20080522


class LimitError(RuntimeError):
    """The capability could not be dropped: the kernel must not start with it."""


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def parse(text: str) -> dict[str, int]:
    """``"user/max_inotify_instances=16 kernel/shmall=65536"`` as a dict; unknown names refused."""
    out: dict[str, int] = {}
    for item in text.split():
        name, _, value = item.partition("=")
        if name not in ALLOWED or not value.isdigit():
            raise ValueError(f"not a namespace limit the supervisor sets: {item!r}")
        out[name] = int(value)
    return out


def apply(text: str) -> list[str]:
    """Write each limit (those the kernel of the OS refused are left out of the answer), then drop
    CAP_SYS_RESOURCE for good. The names that were set."""
    done = []
    for name, value in parse(text).items():
        try:
            with open(f"/proc/sys/{name}", "w", encoding="ascii") as f:
                f.write(str(value))
        except OSError:
            continue
        done.append(name)
    drop_resource_capability()
    return done


def drop_resource_capability() -> None:
    """CAP_SYS_RESOURCE (and CAP_SETPCAP, which dropping it takes) out of the ambient and bounding
    sets (so no exec regains them, as root in the namespace would from the bounding set) and out of
    our own sets."""
    libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
    if libc is None:
        raise LimitError("not Linux: no capability to drop")
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    # EPERM without CAP_SETPCAP (an unprivileged user's sandbox): then no exec can regain them either,
    # since a user other than root gets only ambient capabilities across exec.
    for cap in GIVEN:  # CAP_SETPCAP last: each drop needs it
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise LimitError(f"capget failed (errno {ctypes.get_errno()})")
    bits = sum(1 << cap for cap in GIVEN)
    for field in ("effective", "permitted", "inheritable"):
        setattr(data[0], field, getattr(data[0], field) & ~bits)
    if libc.capset(ctypes.byref(header), data) != 0:
        raise LimitError(f"capset failed (errno {ctypes.get_errno()})")
    if _in_bounding_set() and os.getuid() == 0:
        raise LimitError("CAP_SYS_RESOURCE is still in the bounding set, and root regains it at exec")


def _in_bounding_set() -> bool:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("CapBnd:"):
                return bool(int(line.split()[1], 16) & (1 << CAP_SYS_RESOURCE))
    return True
