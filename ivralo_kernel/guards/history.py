"""[guards] Copies of files before a cell overwrites, truncates, renames over or deletes them.

``<workspace>/.ivralo/history/`` holds timestamped copies and ``index.jsonl``, one line per copy
(time, original path, operation, size, copy), so a person can find and restore any version. The
folder is bounded twice, oldest copies pruned first: a count cap and a byte cap. A file larger than
the whole byte cap is never copied: the operation is refused instead, saying how to raise the cap.

Each write costs the same whatever the number of copies: the folder is read once, then its copies
are kept in order in memory, and the index is rewritten (only the kept copies' lines) once it holds
twice the count cap, so its cost per write stays constant too. Writes here are the guard's own: the
audit hook lets them through only while this module is writing.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import deque
from pathlib import Path

from ivralo_kernel.protocol import GuardRefusal

DEFAULT_CAP_BYTES = 256 << 20
DEFAULT_CAP_COUNT = 1000
INDEX = "index.jsonl"


class History:
    def __init__(self, directory: str, cap_bytes: int = DEFAULT_CAP_BYTES, cap_count: int = DEFAULT_CAP_COUNT) -> None:
        self.directory = Path(directory)
        self.cap_bytes, self.cap_count = cap_bytes, cap_count
        self._copies: deque[tuple[str, int]] | None = None  # (name, size), oldest first; read on first use
        self._bytes = 0
        self._index_lines = 0
        self.taken: dict[str, str] = {}  # this cell's copies: original path -> copy name (the first)

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
        copies = self._known()
        with open(self.directory / INDEX, "a", encoding="utf-8") as index:
            index.write(json.dumps(entry) + "\n")
        self._index_lines += 1
        copies.append((copy.name, st.st_size))
        self._bytes += st.st_size
        self._prune(copies)
        self.taken.setdefault(path, copy.name)  # the state before the cell's first change
        return copy

    def take_taken(self) -> dict[str, str]:
        taken, self.taken = self.taken, {}
        return taken

    def _known(self) -> deque[tuple[str, int]]:
        """The copies already there (other kernels of this workspace, earlier sessions): read once."""
        if self._copies is None:
            found = []
            for entry in os.scandir(self.directory):
                if not entry.name.startswith(INDEX) and entry.is_file(follow_symlinks=False):
                    found.append((entry.name, entry.stat(follow_symlinks=False).st_size))
            self._copies = deque(sorted(found))  # names start with their time stamp
            self._bytes = sum(size for _, size in found)
            try:
                with open(self.directory / INDEX, "rb") as index:
                    self._index_lines = sum(1 for _ in index)
            except FileNotFoundError:
                self._index_lines = 0
        return self._copies

    def _prune(self, copies: deque[tuple[str, int]]) -> None:
        while copies and (len(copies) > self.cap_count or self._bytes > self.cap_bytes):
            name, size = copies.popleft()
            self._bytes -= size
            try:
                (self.directory / name).unlink()
            except FileNotFoundError:
                pass  # pruned by another kernel of this workspace
        if self._index_lines > 2 * self.cap_count:
            self._compact_index({name for name, _ in copies})

    def _compact_index(self, kept: set[str]) -> None:
        """Keep only the lines of copies still there (a temporary file, then an atomic replace)."""
        index = self.directory / INDEX
        fresh = self.directory / (INDEX + ".new")
        lines = 0
        with open(index, encoding="utf-8") as old, open(fresh, "w", encoding="utf-8") as new:
            for line in old:
                try:
                    name = json.loads(line).get("copy")
                except (ValueError, AttributeError):
                    continue
                if name in kept:
                    new.write(line)
                    lines += 1
        os.replace(fresh, index)
        self._index_lines = lines
