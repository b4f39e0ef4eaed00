"""[host] Telling the kernel what the egress proxy decided, for the running cell's "hosts tried" line.

The line is printed by the kernel when the cell ends, so a decision must reach the kernel before the
cell can end: before the client that asked hears anything back (the response's first byte, the
tunnel's ``200``, the refusal). It need not hold up anything else: the note is sent at once, and the
proxy waits for the kernel's acknowledgement only just before answering its client, so the wait
overlaps the upstream connect and the server's reply. A note the kernel already has for this
execution (the second request to the same host in a loop, pip's many requests) is not sent again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ivralo_kernel.protocol.messages import EgressNote

# How long the proxy waits for the kernel to note a decision (a kernel whose native code holds the
# GIL cannot answer; the connection goes on anyway after this).
NOTE_WAIT_S = 2.0
# Outcomes remembered for one execution: a cell looping over many hosts (each refused at once) would
# otherwise grow this without end; past it the oldest are forgotten (a repeat is noted again: harmless).
MAX_NOTES_KEPT = 1024

Send = Callable[[EgressNote, Callable[[dict[str, Any]], None]], None]
Wait = Callable[[], None]


class EgressNotes:
    def __init__(self, send: Send) -> None:
        self._send = send  # (note, on_reply): to the kernel's control channel
        self._lock = threading.Lock()
        self._execution: str | None = None
        self._sent: dict[tuple[str, int, bool, str], threading.Event] = {}

    def note(self, execution: str, host: str, port: int, allowed: bool, reason: str) -> Wait:
        """Send the note (once per execution and outcome); returns what blocks until the kernel has it."""
        key = (host, port, allowed, reason)
        with self._lock:
            if execution != self._execution:  # a new cell: its line starts empty
                self._execution, self._sent = execution, {}
            noted = self._sent.get(key)
            first = noted is None
            if noted is None:
                noted = self._sent[key] = threading.Event()
                while len(self._sent) > MAX_NOTES_KEPT:
                    del self._sent[next(iter(self._sent))]
        if first:
            note = EgressNote(host=host, port=port, allowed=allowed, reason=reason)
            self._send(note, lambda _reply: noted.set())
        return lambda: _wait(noted)


def _wait(noted: threading.Event) -> None:
    noted.wait(NOTE_WAIT_S)
