"""[protocol] The owner's stamp on a folder ivralo makes in a shared temp folder: ``.ivralo-owner``,
which the owner keeps open under ``flock(LOCK_EX)`` for the folder's whole life. The host's sweep
(host/sandbox/owned_folders.py) removes a stamped folder whose lock it can take: its owner is gone,
however it ended. Shared by the host's folders and the fallback supervisor's private ``/tmp`` folder."""

from __future__ import annotations

import fcntl
import os

STAMP = ".ivralo-owner"


def stamp_folder(folder: str, start_time: str = "?") -> int:
    """Locks a new stamp in ``folder`` (made by the caller, empty) and returns its descriptor: close
    it to let go. The stamp is locked under a temporary name and only then renamed into place, so a
    sweep never sees an unlocked stamp of a folder being made. It says ``pid start_time`` of the owner,
    for people and tests; the lock alone decides (pids are reused, locks are not)."""
    making = os.path.join(folder, STAMP + ".new")
    fd = os.open(making, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file: nobody else holds it
        os.write(fd, f"{os.getpid()} {start_time}\n".encode())
        os.rename(making, os.path.join(folder, STAMP))
    except BaseException:
        os.close(fd)
        raise
    return fd
