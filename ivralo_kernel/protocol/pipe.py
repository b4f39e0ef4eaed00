"""[protocol] Lines on the supervisor's pipes, typed: the kernel's stage pipe (``ENV_STAGE_FD``) and
the host's pipe (``ENV_HOST_PIPE_FD``). One line each, ``\\n``-terminated; ``decode`` reads what
``encode`` wrote and nothing else (a line that is not one is ``None``, never a guess)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ivralo_kernel.protocol import names


@dataclass(frozen=True)
class Stage:
    """The kernel reached a start-up stage (the supervisor logs the last one if the start fails)."""

    name: str


@dataclass(frozen=True)
class KillAt:
    """End the tree at this CLOCK_MONOTONIC time if ``execution`` still runs; ``at=None`` disarms."""

    execution: str
    at: float | None


@dataclass(frozen=True)
class KillNow:
    """The kernel asks for its whole tree to be ended now."""


PipeLine = Stage | KillAt | KillNow


def encode(line: PipeLine) -> bytes:
    if isinstance(line, Stage):
        text = names.PIPE_STAGE + line.name.replace("\n", " ")
    elif isinstance(line, KillAt):
        text = f"{names.PIPE_KILL_AT}{line.execution}:{'off' if line.at is None else repr(line.at)}"
    else:
        text = names.PIPE_KILL_NOW
    return text.encode() + b"\n"


def decode(text: str) -> PipeLine | None:
    if text.startswith(names.PIPE_STAGE):
        return Stage(text.removeprefix(names.PIPE_STAGE))
    if text == names.PIPE_KILL_NOW:
        return KillNow()
    if text.startswith(names.PIPE_KILL_AT):
        execution, _, when = text.removeprefix(names.PIPE_KILL_AT).rpartition(":")
        if when == "off":
            return KillAt(execution, None)
        try:
            at = float(when)
        except ValueError:
            return None
        return KillAt(execution, at) if math.isfinite(at) else None
    return None


# No line either side writes is longer than this (a stage name, an execution id and a time). The
# kernel's stage pipe is held by code the supervisor does not trust: a longer line is dropped whole,
# so the reader never holds more than this of it, however the writer splits or never ends it.
MAX_LINE = 4096


@dataclass
class LineReader:
    """The lines of one pipe, fed chunk by chunk as they are read: each complete line, decoded."""

    pending: bytes = b""
    dropping: bool = False  # inside a line longer than MAX_LINE: skipped up to its end

    def feed(self, chunk: bytes) -> list[PipeLine]:
        *ended, rest = chunk.split(b"\n")
        found: list[PipeLine] = []
        for part in ended:
            line, self.pending = self.pending + part, b""
            if self.dropping:
                self.dropping = False
                continue
            if len(line) <= MAX_LINE and (message := decode(line.decode(errors="replace"))) is not None:
                found.append(message)
        if not self.dropping:
            self.pending += rest
            if len(self.pending) > MAX_LINE:
                self.pending, self.dropping = b"", True
        return found
