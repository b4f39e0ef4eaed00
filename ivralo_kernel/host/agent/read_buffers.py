"""[host] The memory a segment's bytes are copied into (``Exchange.read``), kept for the next read.

The host copies what the kernel wrote into memory of its own (the kernel can rewrite the segment at
any moment). Fresh memory for 100 MB is 25,600 page faults, or 50 huge pages when the kernel can make
them, which on a host whose memory is fragmented means compaction first: the copy of a 100 MB
``get_dataframe`` took 50-170 ms here, and 12 ms into pages already faulted in.

So the buffer of the last read is kept: the value the host decoded from it (a DataFrame whose columns
are views of it) holds it while it is used; once no view of it is left, the next read that fits reuses
it. Kept for ``KEEP_S`` at most after its last read, and only one: a session that fetched one large
table holds its memory for half a minute, not for its life. A buffer some value still uses is never
reused: an anonymous mapping refuses to resize while any buffer of it is exported (``_unused``), which
is the check.
"""

from __future__ import annotations

import contextlib
import mmap
import threading
from typing import Any

KEEP_S = 30.0
MIN_BYTES = 8 << 20  # smaller reads are cheap to fault in: fresh memory, as before
_HUGE = 2 << 20


class ReadBuffers:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: mmap.mmap | None = None
        self._reads = 0  # which read the kept buffer served: a timer armed for an earlier one lets it be
        self._timer: threading.Timer | None = None

    def take(self, length: int) -> Any:
        """``length`` writable bytes of the host's own: a numpy array of uint8 (a bytearray where
        numpy is missing), which a decoded value may keep views of."""
        try:
            import numpy
        except ImportError:
            return bytearray(length)
        if length < MIN_BYTES:
            # numpy's allocator asks for transparent huge pages (madvise) for large blocks.
            return numpy.empty(length, dtype=numpy.uint8)
        with self._lock:
            kept, self._kept = self._kept, None
            fits = kept is not None and length <= len(kept) <= 2 * length and _unused(kept)
            if not fits:
                kept = _fresh(length)
            assert kept is not None
            self._kept = kept
            self._reads += 1
            self._release_later()
        return numpy.frombuffer(kept, dtype=numpy.uint8, count=length)

    def release(self) -> None:
        """Let the kept buffer go (the session ends): its memory goes with the last view of it."""
        with self._lock:
            self._kept = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _release_later(self) -> None:
        """(holding the lock) ``KEEP_S`` after the last read, the kept buffer goes."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = threading.Timer(KEEP_S, self._expire, args=(self._reads,))
        self._timer.daemon = True
        self._timer.start()

    def _expire(self, read: int) -> None:
        with self._lock:
            if read == self._reads:  # no read since (a cancelled timer may still fire once)
                self._kept = None
                self._timer = None


def _fresh(length: int) -> mmap.mmap:
    size = -(-length // _HUGE) * _HUGE
    buffer = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(AttributeError, OSError):
        buffer.madvise(mmap.MADV_HUGEPAGE)
    return buffer


def _unused(buffer: mmap.mmap) -> bool:
    """No value holds a view of it: resizing to its own size is refused while a buffer is exported."""
    try:
        buffer.resize(len(buffer))
    except (BufferError, OSError, SystemError, ValueError):
        return False
    return True
