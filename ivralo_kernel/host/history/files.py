"""[host] The history's file work, done by descriptor and never through a link: what a path holds
now, and writing a restored file atomically (``history_store``'s restores and kept copies).

Every open is relative to a folder's descriptor with ``O_NOFOLLOW``, so a link swapped in by code in
the kernel cannot send a read or a write elsewhere.
"""

from __future__ import annotations

import errno
import os
import stat
import time

READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def holds(path: str, now: os.stat_result | None, content: bytes) -> bool:
    """The file already holds these bytes (then a restore has nothing to do)."""
    if now is None or not stat.S_ISREG(now.st_mode) or now.st_size != len(content):
        return False
    try:
        with os.fdopen(os.open(path, READ), "rb") as current:
            return current.read() == content
    except OSError:
        return False


def current_file(parent: int, name: str) -> tuple[os.stat_result | None, bytes | None]:
    """The file there now: its status (a link's own) and, for a regular file, its bytes; a folder
    there is an ``IsADirectoryError`` (nothing is restored over it)."""
    try:
        now = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return None, None
    if stat.S_ISDIR(now.st_mode):
        raise IsADirectoryError(errno.EISDIR, "a folder", name)
    if not stat.S_ISREG(now.st_mode):
        return now, None  # a link or a special file: replaced, not kept (it holds no content of its own)
    fd = os.open(name, READ, dir_fd=parent)
    with os.fdopen(fd, "rb") as current:
        return now, current.read()


def write_atomically(parent: int, name: str, content: bytes, mode: int) -> None:
    """``name`` in the folder ``parent`` holds ``content`` with ``mode``, all at once: a temporary file
    beside it, then a rename over it (a link there is replaced, never followed)."""
    temp = f".{name}.ivralo-restore-{os.getpid()}-{time.monotonic_ns()}"
    fd = os.open(temp, CREATE, 0o600, dir_fd=parent)
    try:
        try:
            write_all(fd, content)
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException:
        try:
            os.unlink(temp, dir_fd=parent)
        except OSError:
            pass
        raise


def write_all(fd: int, data: bytes) -> None:
    """Every byte of ``data`` to ``fd`` (``os.write`` may write fewer)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def why_unreadable(exc: OSError) -> str:
    """Why a copy cannot be opened, as a sentence's end."""
    if exc.errno == errno.ELOOP:
        return "it is a link, which the write guard never makes"
    if exc.errno == errno.ENOENT:
        return "it is gone (pruned, or deleted by hand)"
    return exc.strerror or str(exc)
