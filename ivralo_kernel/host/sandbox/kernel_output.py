"""[host] What a kernel's tree writes to its stdout and stderr, passed on to the host's own.

The kernel gets pipes, never the host's descriptors (a cell could otherwise write, seek or truncate
the host's log file, or drive the person's terminal). Lines are passed on as text with every control
character but tab and newline, and every bidi override, escaped (``protocol.terminal``), so the
kernel cannot send escape sequences to a terminal. A line longer than ``LINE_PART`` bytes is passed on
in parts of that size: the host never holds more of a line than that, however long the kernel's is.
"""

from __future__ import annotations

import codecs
import contextlib
import sys
import threading
from typing import IO, Any

from ivralo_kernel.protocol.terminal import terminal_safe

LINE_PART = 64 << 10


def printable(text: str) -> str:
    return terminal_safe(text, keep_newlines=True)


def _copy_lines(source: IO[bytes], target: Any) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character cut between parts stays whole
    with source:
        for raw in iter(lambda: source.readline(LINE_PART), b""):
            try:
                target.write(printable(decoder.decode(raw)))
                target.flush()
            except (OSError, ValueError):  # the host's stream is closed: keep draining
                continue
        with contextlib.suppress(OSError, ValueError):  # a character cut short by the end: shown as one
            if tail := decoder.decode(b"", final=True):
                target.write(printable(tail))
                target.flush()


def relay_output(process: Any) -> None:
    """Drain the launched process's stdout and stderr pipes into the host's, on threads of their own."""
    if process is None:
        return
    for source, name in ((process.stdout, "stdout"), (process.stderr, "stderr")):
        if source is not None:
            target = getattr(sys, name)
            threading.Thread(
                target=_copy_lines, args=(source, target), name=f"ivralo-kernel-{name}", daemon=True
            ).start()
