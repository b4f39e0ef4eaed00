"""[host] Folders a host makes for its kernels, each stamped with its owner, and the sweep of stale ones.

A host SIGKILLed (or an OOM-killed server) never runs its cleanup, so its ``/tmp/ivralo-*`` and
``/dev/shm/ivralo-xchg-*`` folders would stay for good. Each folder therefore holds a stamp file,
``.ivralo-owner``, that the owning host keeps open under ``flock(LOCK_EX)`` for the folder's whole
life. Linux drops the lock when the last descriptor of it closes, i.e. when the owner is gone, however
it ended. The next host's start takes the lock of every stamped folder without waiting: where it gets
it, nobody owns the folder any more and it is removed; where it does not, a live host owns it and it
stays. The stamp also says ``pid start_time`` of the owner, for people and for tests (``tests/
leftovers.py``), never for the decision: pids are reused, locks are not.

The stamp itself (made locked, then renamed into place) is ``protocol/owner_stamp.py``'s, shared with
the fallback supervisor's private /tmp folder. A folder without a stamp (one being made, or left by an
older release) is never removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import threading
import time

import psutil

from ivralo_kernel.protocol.owner_stamp import STAMP, stamp_folder

__all__ = ["STAMP", "make_owned_folder", "release_owned_folder", "sweep_stale_folders"]

# How often one host process looks for stale folders: at its first folder, then at most this often.
SWEEP_INTERVAL_S = 300.0

_held: dict[str, int] = {}  # folder -> the stamp's descriptor, kept open (and locked) while we own it
_lock = threading.Lock()
_last_sweep: dict[tuple[str, str], float] = {}


def make_owned_folder(prefix: str, parent: str | None = None) -> str:
    """A new private folder (``tempfile.mkdtemp``), stamped and locked as this process's own. Stale
    folders of the same prefix left by dead hosts are swept first (at most once per interval)."""
    parent = parent or tempfile.gettempdir()
    _sweep_now_and_then(parent, prefix)
    folder = tempfile.mkdtemp(prefix=prefix, dir=parent)
    try:
        fd = stamp_folder(folder, _start_time(os.getpid()))
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    with _lock:
        _held[folder] = fd
    return folder


def release_owned_folder(folder: str) -> None:
    """Removes one of our folders, then lets go of its stamp (in this order: a sweep that sees it
    unlocked finds nothing left to remove, or removes what we would have)."""
    shutil.rmtree(folder, ignore_errors=True)
    with _lock:
        fd = _held.pop(folder, None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def sweep_stale_folders(parent: str, prefix: str) -> list[str]:
    """Removes each stamped ``parent/prefix*`` folder of this user that no live process owns; returns them."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    uid = os.geteuid()
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        with contextlib.suppress(OSError):
            if entry.is_symlink() or not entry.is_dir() or entry.stat().st_uid != uid:
                continue
            with _lock:
                if entry.path in _held:  # ours, alive
                    continue
            if _is_stale(entry.path):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
    return removed


def _is_stale(folder: str) -> bool:
    """True when the folder's stamp can be locked at once: its owner is gone. No stamp: never stale."""
    try:
        fd = os.open(os.path.join(folder, STAMP), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # EWOULDBLOCK: a live host holds it
    finally:
        os.close(fd)  # the lock, if we got it, goes with it: the rmtree that follows needs none
    return True


def _sweep_now_and_then(parent: str, prefix: str) -> None:
    key = (parent, prefix)
    now = time.monotonic()
    with _lock:
        last = _last_sweep.get(key)
        if last is not None and now - last < SWEEP_INTERVAL_S:
            return
        _last_sweep[key] = now
    sweep_stale_folders(parent, prefix)


def _start_time(pid: int) -> str:
    try:
        return repr(psutil.Process(pid).create_time())
    except psutil.Error:
        return "?"


def _fresh_lock_after_fork() -> None:
    """A forked child inherits the stamps' descriptors (so the parent's folders stay locked while
    either lives) but not the state of our lock, which another thread may have held at the fork."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_lock_after_fork)
