"""[host] Where a large query result goes to the kernel: one file per answer in the kernel's exchange
folder (the data plane's, on tmpfs), holding the result's Arrow IPC stream.

The host writes it; the kernel reads it and unlinks it. Nothing of the kernel's decides where or
how much the host writes: the name is the host's own (``seg-sql-`` and a random token), made with
``O_CREAT | O_EXCL | O_NOFOLLOW`` in the folder's directory descriptor, opened when the responder
was made, before the kernel ran a line (a folder the kernel renamed, or a symlink it put in the
folder's place, is not followed), and the length is the stream's. The host never reads a segment
back and never maps one (a file the kernel truncates cannot fault the host).

A segment the kernel never took (its cell was interrupted before the answer came) is unlinked by
the host once it is ``STALE_S`` old, at the next answer, and all of them when the responder closes;
a restart's ``clear_exchange_folder`` removes what is left.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from typing import Any

from ivralo_kernel.host.sandbox.exchange_folder import SEGMENT_PREFIX

SQL_SEGMENT_PREFIX = f"{SEGMENT_PREFIX}sql-"
STALE_S = 600.0  # longer than the kernel waits for an answer (broker_calls.ANSWER_TIMEOUT_S)


class ResultSegments:
    def __init__(self, folder: str) -> None:
        self.folder = os.path.realpath(folder)
        self._dir = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        self._written: dict[str, float] = {}  # name -> when (the broker's call threads share it)
        self._lock = threading.Lock()

    def write(self, pa: Any, table: Any) -> tuple[str, int]:
        """``table``'s Arrow IPC stream in a new segment: (its path, as the kernel opens it; its length)."""
        self.sweep(STALE_S)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        data = memoryview(sink.getvalue()).cast("B")
        name = f"{SQL_SEGMENT_PREFIX}{secrets.token_hex(12)}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(name, flags, 0o600, dir_fd=self._dir)
        with self._lock:
            self._written[name] = time.monotonic()
        try:
            done = 0
            while done < len(data):
                done += os.write(fd, data[done:])
        except BaseException:
            self._unlink(name)
            raise
        finally:
            os.close(fd)
            data.release()
        return os.path.join(self.folder, name), done

    def sweep(self, older_than: float = 0.0) -> None:
        """Unlink the segments written more than ``older_than`` seconds ago (the kernel took the rest)."""
        now = time.monotonic()
        with self._lock:
            old = [name for name, when in self._written.items() if now - when >= older_than]
        for name in old:
            self._unlink(name)

    def _unlink(self, name: str) -> None:
        with self._lock:
            self._written.pop(name, None)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self._dir)

    def close(self) -> None:
        self.sweep()
        with contextlib.suppress(OSError):
            os.close(self._dir)
