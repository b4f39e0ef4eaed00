"""[host] How much of the machine a sandbox may hold outside its processes' memory: the size of each
tmpfs it gets, and the limits its supervisor lowers for its own user and IPC namespaces.

* **tmpfs**: every folder the sandbox empties is a tmpfs of its own, and a file written there is
  memory (shmem) that no process's RSS shows. The scratch folders (``/tmp``, ``/var/tmp``,
  ``/dev/shm``) get room for real work, as much as the kernel's hard memory limit (the observer
  counts what they hold toward that limit too, see ``host/watch/held_memory.py``); the others (``/run``,
  runtime folders, emptied credential stores) a little. bwrap has ``--size`` from 0.7.0 on; an
  older one gets unsized mounts, which the observer still counts.
* **Namespaces**: inotify instances and watches are the *user's*, counted in every user namespace
  up to the machine's, so a kernel could use up the person's own (the host's file watchers then
  fail with EMFILE). The sandbox's user namespace gets a limit of its own, a share of the
  machine's; System V IPC, private to the sandbox, gets small limits (64 MiB of shared memory). The
  supervisor writes them (``supervisor/namespace_limits.py``) with the one capability bwrap adds
  for it, and drops that capability before the kernel starts.
"""

from __future__ import annotations

import functools
import os
import stat
import subprocess
from pathlib import Path

import psutil

SCRATCH_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm")  # noqa: S108 - the sandbox's own, sized
EMPTIED_BYTES = 16 << 20  # what an emptied /run, runtime folder or credential store may hold
MEM_SHARE_DEFAULT = 8  # without a hard limit, each scratch tmpfs may hold 1/8 of the machine's memory
# The sandbox's share of the user's inotify limits: several kernels and the host's own watchers
# (JupyterLab, editors) must fit in what is left.
INOTIFY_SHARE = 8
INOTIFY_INSTANCES_MAX = 64
INOTIFY_WATCHES_MAX = 65_536
# A user namespace's limits read INT_MAX when the host itself runs in one (the real limit is above):
# then these, the Linux defaults, are the base.
INOTIFY_INSTANCES_BASE = 128
INOTIFY_WATCHES_BASE = 8_192
INT_MAX = 2**31 - 1
MSG_QUEUES = 16  # System V message queues (each up to msgmnb, 16 KiB by default)
# System V shared memory, all segments together: a segment attached, filled and detached is held by
# no process (no RSS, no descriptor, no mapping), so the observer cannot count it; a small cap instead.
SYSV_SHM_BYTES = 64 << 20
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
HELP_TIMEOUT_S = 10.0


@functools.cache
def bwrap_sizes_tmpfs(bwrap: str) -> bool:
    """Whether this bwrap has ``--size`` (0.7.0 and later; Debian 12's 0.8.0 has it)."""
    try:
        done = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=HELP_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--size" in done.stdout + done.stderr


def bwrap_adds_capabilities(bwrap: str) -> bool:
    """Whether ``--cap-add`` works: always with an unprivileged (namespace) bwrap; a setuid one
    accepts it from root alone."""
    try:
        setuid = bool(os.stat(bwrap).st_mode & stat.S_ISUID)
    except OSError:
        return False
    return not setuid or os.geteuid() == 0


def scratch_bytes(hard_limit_bytes: int | None) -> int:
    """The size of each scratch tmpfs: the kernel's hard memory limit, or a share of the machine's."""
    if hard_limit_bytes:
        return max(int(hard_limit_bytes), EMPTIED_BYTES)
    return max(_mem_total() // MEM_SHARE_DEFAULT, EMPTIED_BYTES)


def tmpfs_bytes(path: str, scratch: int) -> int:
    return scratch if path in SCRATCH_FOLDERS else EMPTIED_BYTES


def namespace_limits(scratch: int) -> str:
    """What the supervisor writes under ``/proc/sys`` for the sandbox's own namespaces (see
    ``protocol.names.ENV_NAMESPACE_LIMITS``)."""
    limits = {
        "user/max_inotify_instances": inotify_instances_allowed(),
        "user/max_inotify_watches": inotify_watches_allowed(),
        "kernel/shmmax": min(scratch, SYSV_SHM_BYTES),
        "kernel/shmall": max(1, min(scratch, SYSV_SHM_BYTES) // PAGE),
        "kernel/msgmni": MSG_QUEUES,
    }
    return " ".join(f"{name}={value}" for name, value in limits.items())


def inotify_instances_allowed() -> int:
    """The sandbox's inotify instances (the observer's count for a kernel with no namespace limit)."""
    return _share(_read_int("/proc/sys/user/max_inotify_instances"), INOTIFY_INSTANCES_BASE, INOTIFY_INSTANCES_MAX)


def inotify_watches_allowed() -> int:
    """The sandbox's inotify watches, all instances together."""
    return _share(_read_int("/proc/sys/user/max_inotify_watches"), INOTIFY_WATCHES_BASE, INOTIFY_WATCHES_MAX)


def _share(machine: int | None, base: int, cap: int) -> int:
    if machine is None or machine >= INT_MAX:
        machine = base
    return max(1, min(machine // INOTIFY_SHARE, cap))


def _read_int(path: str) -> int | None:
    try:
        with open(path, encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _mem_total() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 8 << 30


def available_memory() -> int:
    """Bytes this process tree can still use: the host's available memory, or less when a cgroup
    limit is closer (cgroup v2 ``memory.max``, or v1 ``memory.limit_in_bytes``)."""
    available = int(psutil.virtual_memory().available)
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < (1 << 60):
            available = min(available, max(0, int(limit) - usage))
    return available
