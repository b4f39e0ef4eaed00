"""[host] Read what the supervisor wrote to ``.ivralo/python-worker.log`` about a failed start."""

from __future__ import annotations

import os
from pathlib import Path

HEADER = "ivralo kernel failed to start"
STAGE = "last stage reached: "
TAIL = "stderr tail:"


def last_start_failure(path: Path, since: float) -> tuple[str, str]:
    """(last stage reached, last stderr lines) from the newest entry written after ``since``."""
    try:
        if os.path.getmtime(path) < since:
            return "unknown (no log entry for this start)", ""
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "unknown (no worker log)", ""
    entry = text[text.rfind(HEADER) :] if HEADER in text else ""
    stage, tail, in_tail = "unknown", [], False
    for line in entry.splitlines():
        stripped = line.strip()
        if stripped.startswith(STAGE):
            stage = stripped.removeprefix(STAGE)
        elif stripped == TAIL:
            in_tail = True
        elif in_tail:
            tail.append(stripped)
    return stage, " | ".join(t for t in tail if t)[-600:]
