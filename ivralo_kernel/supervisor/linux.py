"""[supervisor] The few Linux process controls the supervisor needs, through libc's prctl.

On another OS (or a libc without prctl) every call reports False and the supervisor still runs,
with tree cleanup reduced to what it can see of its own children.
"""

from __future__ import annotations

import ctypes
import sys

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
KEYCTL_JOIN_SESSION_KEYRING = 1

_libc: ctypes.CDLL | None
try:
    _libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
except OSError:  # pragma: no cover - exotic platforms
    _libc = None


def prctl(option: int, arg: int) -> bool:
    """True when the kernel accepted the setting."""
    if _libc is None:
        return False
    return int(_libc.prctl(option, arg, 0, 0, 0)) == 0


def set_child_subreaper() -> bool:
    """Orphaned descendants are reparented to us instead of to init, so none escapes the tree."""
    return prctl(PR_SET_CHILD_SUBREAPER, 1)


def set_parent_death_signal(signum: int) -> bool:
    """Ask the kernel of the OS to send ``signum`` when our parent (thread) exits."""
    return prctl(PR_SET_PDEATHSIG, signum)


def set_not_dumpable() -> bool:
    """No process of the same user (the kernel, in the sandbox) may ptrace us or read or write our
    memory: the deadline's backstop and the host's pipe live here. (The kernel's exec resets it.)"""
    return prctl(PR_SET_DUMPABLE, 0)


def leave_the_session_keyring(keyctl_nr: int) -> bool:
    """Join a new, empty session keyring: the kernel's tree no longer holds the person's (whose keys
    it could otherwise search and read by possession)."""
    if _libc is None:
        return False
    return int(_libc.syscall(keyctl_nr, KEYCTL_JOIN_SESSION_KEYRING, None)) >= 0
