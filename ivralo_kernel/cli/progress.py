"""[cli] Per-cell progress of ``ivralo-kernel run`` on stderr (stdout is the report).

On a terminal, one line rewritten in place (``[3/40] #####--------------- cell 3: import pandas``)
and cleared at the end, so a long notebook shows where it is without scrolling the report away.
Anywhere else (a pipe, a CI log), one plain line per finished cell (``cell 3/40 ok (0.12 s)``):
carriage returns would garble a log.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import Literal, TextIO

from ivralo_kernel.protocol.terminal import terminal_safe

Mode = Literal["auto", "bar", "lines", "none"]
BAR_WIDTH = 20


class Progress:
    def __init__(self, total: int, mode: Mode = "auto", stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if mode == "auto":
            mode = "bar" if _isatty(self.stream) else "lines"
        self.mode = mode
        self.total = total
        self._started = 0.0
        self._drawn = False

    def start(self, number: int, source: str) -> None:
        """Cell ``number`` (1-based, code cells only) is about to run."""
        self._started = time.monotonic()
        if self.mode != "bar":
            return
        done = round(BAR_WIDTH * (number - 1) / max(self.total, 1))
        first = terminal_safe(next((line.strip() for line in source.splitlines() if line.strip()), ""))
        text = f"[{number}/{self.total}] {'#' * done}{'-' * (BAR_WIDTH - done)} cell {number}"
        if first:
            text += f": {first}"
        # One line, never wider than the terminal: a wrapped line cannot be rewritten with \r.
        width = shutil.get_terminal_size((80, 24)).columns - 1
        self.stream.write("\r\033[K" + text[:width])
        self.stream.flush()
        self._drawn = True

    def done(self, number: int, outcome: str) -> None:
        """Cell ``number`` ended: ``outcome`` is "ok", "error" or "killed"."""
        if self.mode != "lines":
            return
        seconds = time.monotonic() - self._started
        self.stream.write(f"cell {number}/{self.total} {outcome} ({seconds:.2f} s)\n")
        self.stream.flush()

    def finish(self) -> None:
        """Clear the bar, so the report starts on a clean line."""
        if self._drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._drawn = False


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False
