"""[kernel] This process's mount table, as the sandbox built it: what is read-only inside the workspace.

The host decides which paths of the workspace are closed (its ``tool_files`` setting, placeholders
for missing ones, a project's ``.venv``); the kernel learns them from ``/proc/self/mountinfo`` so that
its write guard refuses each with a sentence instead of the OS's bare "Read-only file system".
"""

from __future__ import annotations

import os
import re

MOUNTINFO = "/proc/self/mountinfo"
_ESCAPE = re.compile(r"\\([0-7]{3})")  # mountinfo writes space, tab, newline and backslash as \ooo


def _unescape(field: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def read_only_mounts_inside(workspace: str, mountinfo: str = MOUNTINFO) -> list[str]:
    """Mount points strictly inside ``workspace`` whose mount is read-only (empty when unreadable)."""
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    prefix = workspace.rstrip(os.sep) + os.sep
    found: list[str] = []
    for line in lines:
        fields = line.split(" ")
        if len(fields) < 6:
            continue
        point, options = _unescape(fields[4]), fields[5].split(",")
        if point.startswith(prefix) and "ro" in options and point not in found:
            found.append(point)
    return found
