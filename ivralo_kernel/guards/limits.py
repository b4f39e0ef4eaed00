"""[guards] Resource limits and process flags for the kernel process (changes process state).

* ``RLIMIT_DATA`` caps the heap: an oversized allocation raises ``MemoryError`` in the cell and
  the kernel lives on. Soft = hard, so user code cannot raise it again. ``RLIMIT_AS`` is not used:
  it counts thread stacks and malloc arena reservations, and fails at a small resident size.
* ``RLIMIT_CORE = 0``: a crash never writes the kernel's memory (and any secret in it) to disk.
* Not dumpable: a same-user process cannot read this kernel's ``/proc/<pid>/mem`` or ``environ``.
"""

from __future__ import annotations

import ctypes
import resource
import sys
from dataclasses import dataclass

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3


@dataclass(frozen=True)
class AppliedLimits:
    memory_limit_bytes: int | None
    rlimit_nofile: int | None
    dumpable: bool | None


def _clamp(want: int, resource_id: int) -> int:
    _, hard = resource.getrlimit(resource_id)
    return want if hard == resource.RLIM_INFINITY else min(want, hard)


def _set_not_dumpable() -> bool | None:
    """Returns the resulting dumpable flag, or None where prctl is unavailable."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    return bool(libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0))


def apply_limits(memory_limit_bytes: int | None, rlimit_nofile: int | None) -> AppliedLimits:
    memory = None
    if memory_limit_bytes is not None:
        memory = _clamp(memory_limit_bytes, resource.RLIMIT_DATA)
        resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    nofile = None
    if rlimit_nofile is not None:
        nofile = _clamp(rlimit_nofile, resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    return AppliedLimits(memory, nofile, _set_not_dumpable())
