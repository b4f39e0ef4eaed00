"""[host] The exchange folder: where a kernel and its host pass the data plane's Arrow segments.

Each kernel gets one folder of its own (``/dev/shm`` when it is a tmpfs we may write, else the temp
folder), made by the provisioner before the sandbox is built and bound into it; the data plane
(``dataplane``) writes and reads the segments in it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

from ivralo_kernel.host.sandbox.owned_folders import make_owned_folder, release_owned_folder

__all__ = [
    "SEGMENT_PREFIX",
    "clear_exchange_folder",
    "create_exchange_folder",
    "exchange_root",
    "remove_exchange_folder",
]

SHM = "/dev/shm"  # noqa: S108 - the machine's tmpfs for shared memory; each kernel gets its own folder in it
SEGMENT_PREFIX = "seg-"
EXCHANGE_PREFIX = "ivralo-xchg-"


def exchange_root() -> str:
    """Where exchange folders go: ``/dev/shm`` when it is a tmpfs we may write, else the temp folder."""
    if os.path.isdir(SHM) and os.access(SHM, os.W_OK | os.X_OK) and _filesystem(SHM) == "tmpfs":
        return SHM
    return tempfile.gettempdir()


def _filesystem(path: str) -> str:
    """The type of the file system ``path`` is the mount point of ("" if it is none)."""
    try:
        with open("/proc/mounts", encoding="utf-8") as f:
            types = [line.split()[2] for line in f if len(line.split()) > 2 and line.split()[1] == path]
    except OSError:
        return ""
    return types[-1] if types else ""


def create_exchange_folder() -> str:
    """A new exchange folder, stamped as this host's (``owned_folders``: a later start removes it if
    this host dies without cleaning up)."""
    return make_owned_folder(EXCHANGE_PREFIX, exchange_root())


def remove_exchange_folder(folder: str) -> None:
    release_owned_folder(folder)


def clear_exchange_folder(folder: str) -> None:
    """Segments a kernel never mapped (it died first): the folder stays for the next kernel."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if entry.name.startswith(SEGMENT_PREFIX):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
