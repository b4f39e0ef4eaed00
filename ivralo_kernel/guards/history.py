"""[guards] Copies of files before a cell overwrites, truncates, renames over or deletes them.

``<workspace>/.ivralo/history/`` holds timestamped copies and ``index.jsonl``, one line per copy
(time, original path, operation, size, copy), so a person can find and restore any version. The
folder is bounded by a byte cap, oldest copies pruned first; a file larger than the whole cap is
never copied: the operation is refused instead, saying how to raise the cap. Writes here are the
guard's own: the audit hook lets them through only while this module is writing.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from ivralo_kernel.protocol import GuardRefusal

DEFAULT_CAP_BYTES = 256 << 20
INDEX = "index.jsonl"


class History:
    def __init__(self, directory: str, cap_bytes: int = DEFAULT_CAP_BYTES) -> None:
        self.directory = Path(directory)
        self.cap_bytes = cap_bytes

    def save(self, path: str, operation: str) -> Path | None:
        """Copy ``path`` (if it is an existing regular file) before ``operation`` changes it."""
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            return None
        if not os.path.isfile(path) or os.path.islink(path):
            return None
        if st.st_size > self.cap_bytes:
            raise GuardRefusal(
                guard="write guard",
                operation=operation,
                target=path,
                why=f"it is {st.st_size} bytes, more than the history cap of {self.cap_bytes} bytes, so it "
                "could not be kept before being changed",
                instead="Ask the person to raise IVRALO_HISTORY_CAP_BYTES (or the history_cap_bytes setting), "
                "or to make this change themselves.",
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime()) + f"-{time.time_ns() % 1_000_000_000:09d}"
        copy = self.directory / f"{stamp}-{os.path.basename(path)}"
        shutil.copy2(path, copy)
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "path": path,
            "operation": operation,
            "size": st.st_size,
            "copy": copy.name,
        }
        with open(self.directory / INDEX, "a", encoding="utf-8") as index:
            index.write(json.dumps(entry) + "\n")
        self._prune()
        return copy

    def _prune(self) -> None:
        copies = sorted(p for p in self.directory.iterdir() if p.name != INDEX)
        total = sum(p.stat().st_size for p in copies)
        for oldest in copies:
            if total <= self.cap_bytes:
                break
            total -= oldest.stat().st_size
            oldest.unlink()
