"""What ivralo leaves behind on this machine: its stamped folders, by owner, and its processes.

For the tests of nothing-left-behind and the soak: ``folders_of(pid)`` lists the ``/tmp/ivralo-*`` and
``/dev/shm/ivralo-xchg-*`` folders whose stamp (``host/sandbox/owned_folders.py``) names that host
process, ``stale_folders()`` those no live process holds, and ``ivralo_processes(pids)`` which of the
recorded pids still run. Other hosts on the machine (other tests, other people) are never counted.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from pathlib import Path

import psutil

from ivralo_kernel.host.sandbox.exchange_folder import EXCHANGE_PREFIX, exchange_root
from ivralo_kernel.host.sandbox.owned_folders import STAMP

ROOTS = ((tempfile.gettempdir(), "ivralo-"), (exchange_root(), EXCHANGE_PREFIX))


def ivralo_folders(roots: tuple[tuple[str, str], ...] = ROOTS) -> list[Path]:
    """Every stamped ivralo folder of this user under ``roots``."""
    found: list[Path] = []
    for parent, prefix in roots:
        with contextlib.suppress(OSError):
            for entry in os.scandir(parent):
                if entry.name.startswith(prefix) and os.path.isfile(os.path.join(entry.path, STAMP)):
                    found.append(Path(entry.path))
    return sorted(set(found))


def owner_of(folder: Path) -> int | None:
    """The pid its stamp names (for attribution only: the lock decides ownership)."""
    try:
        return int((folder / STAMP).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def folders_of(pid: int, roots: tuple[tuple[str, str], ...] = ROOTS) -> list[Path]:
    return [f for f in ivralo_folders(roots) if owner_of(f) == pid]


def is_held(folder: Path) -> bool:
    """True while a live process holds the folder's stamp lock."""
    try:
        fd = os.open(folder / STAMP, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def stale_folders(roots: tuple[tuple[str, str], ...] = ROOTS) -> list[Path]:
    """Stamped folders nobody holds: what a dead host left and the next start will remove."""
    return [f for f in ivralo_folders(roots) if not is_held(f)]


def ivralo_processes(pids: list[int]) -> list[int]:
    """Which of ``pids`` (recorded before a kill) still run (zombies count as gone)."""
    alive = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
    return alive
