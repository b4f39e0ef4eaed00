"""[protocol] ``.ivralo/python-worker.log``: why a kernel did not come up, one JSON object per line.

Written by the supervisor (the kernel died or was stopped before it was ready: its last stage and
stderr tail) and by the kernel itself when it has no supervisor to tell (the traceback of a failed
start); read back by the host for its ``WorkerBootstrapError``. A person reads the same lines:
``message`` is the sentence, the other fields are its details.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TypedDict, TypeGuard

TAIL_LINES = 40
# The host reads no more than the file's last this many bytes: the entries of this start are its newest,
# and the file is writable inside the sandbox, so it may be any size.
TAIL_BYTES = 1 << 20


class StartFailure(TypedDict):
    time: str  # local time, for the person reading the file
    at: float  # seconds since the epoch, for the host matching a start
    pid: int  # the process that wrote it (the supervisor, or the kernel)
    message: str  # "ivralo kernel failed to start: it exited with status 1 before it was ready."
    last_stage: str  # the last stage the kernel reported ("none" before the interpreter ran ours)
    stages: list[str]
    stderr_tail: list[str]  # the kernel's last stderr lines, or the traceback of the failure


def start_failure(message: str, stages: list[str], tail_text: str) -> StartFailure:
    now = time.time()
    return StartFailure(
        time=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)),
        at=now,
        pid=os.getpid(),
        message=message,
        last_stage=stages[-1] if stages else "none (the interpreter did not start)",
        stages=list(stages),
        stderr_tail=tail_text.splitlines()[-TAIL_LINES:],
    )


def append(path: Path, entry: StartFailure) -> None:
    """One line, written with one ``write`` so that two writers never interleave inside an entry."""
    path.parent.mkdir(exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def entries(path: Path) -> list[StartFailure]:
    """The newest entries of the file (its last ``TAIL_BYTES``), oldest first; a line that is not one
    (an older format, a torn write, anything code in the sandbox wrote: the file is writable there)
    is skipped."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - TAIL_BYTES))
            text = f.read(TAIL_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return []
    found: list[StartFailure] = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if _is_entry(entry):
            found.append(entry)
    return found


def _is_entry(entry: object) -> TypeGuard[StartFailure]:
    if not isinstance(entry, dict) or not {"at", "message", "last_stage", "stderr_tail"} <= entry.keys():
        return False
    at, tail = entry["at"], entry["stderr_tail"]
    return (
        isinstance(at, int | float)
        and not isinstance(at, bool)
        and isinstance(entry["last_stage"], str)
        and isinstance(tail, list)
        and all(isinstance(line, str) for line in tail)
    )


def last_start_failure(path: Path, since: float) -> tuple[str, str]:
    """(last stage reached, last stderr lines) of the newest entry written at or after ``since``."""
    recent = [e for e in entries(path) if e["at"] >= since]
    if not recent:
        return "unknown (no log entry for this start)", ""
    entry = recent[-1]
    tail = " | ".join(line.strip() for line in entry["stderr_tail"] if line.strip())
    return entry["last_stage"][:300], tail[-600:]
