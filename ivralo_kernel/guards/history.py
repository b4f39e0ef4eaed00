"""[guards] Copies of files before a cell overwrites, truncates, renames over or deletes them.

``<workspace>/.ivralo/history/`` holds timestamped copies and ``index.jsonl``, one line per copy
(the format: ``protocol/history_index.py``), so a person can list and restore any version
(``ivralo-kernel history``: the host reads and restores, never the kernel). The folder is bounded
twice, oldest copies pruned first: a count cap and a byte cap. A file larger than the whole byte
cap is never copied: the operation is refused instead, saying how to raise the cap.

Each write costs the same whatever the number of copies: the folder is read once, then its copies
are kept in order in memory, and the index is rewritten (only the kept copies' lines) once it holds
twice the count cap, so its cost per write stays constant too. When the index changed under the
kernel (a restore by the host, another kernel of the workspace), the folder is read again. Writes
here are the guard's own: the audit hook lets them through only while this module is writing.
"""

from __future__ import annotations

import os
import shutil
from collections import deque
from pathlib import Path

from ivralo_kernel.protocol import GuardRefusal, history_index

DEFAULT_CAP_BYTES = 256 << 20
DEFAULT_CAP_COUNT = 1000
INDEX = history_index.INDEX


class History:
    def __init__(self, directory: str, cap_bytes: int = DEFAULT_CAP_BYTES, cap_count: int = DEFAULT_CAP_COUNT) -> None:
        self.directory = Path(directory)
        self.cap_bytes, self.cap_count = cap_bytes, cap_count
        self._copies: deque[tuple[str, int]] | None = None  # (name, size), oldest first; read on first use
        self._bytes = 0
        self._index_lines = 0
        self._index_seen: tuple[int, int] | None = None  # (inode, size) of the index after our last write
        self.taken: dict[str, str] = {}  # this cell's copies: original path -> history id (the first)

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
        entry = history_index.new_entry(path, operation, st.st_size)
        copy = self.directory / entry.copy
        with open(self.directory / INDEX, "a+", encoding="utf-8") as index:
            copies = self._known(os.fstat(index.fileno()))  # before our copy exists: it is added below
            shutil.copy2(path, copy)
            size = os.fstat(index.fileno()).st_size
            # A write cut short (a full disk) left a torn last line: ours starts on a line of its own.
            torn = size and os.pread(index.fileno(), 1, size - 1) != b"\n"
            index.write(("\n" if torn else "") + entry.line())
            index.flush()
            self._index_seen = _identity(os.fstat(index.fileno()))
        self._index_lines += 1
        copies.append((copy.name, st.st_size))
        self._bytes += st.st_size
        self._prune(copies)
        self.taken.setdefault(path, entry.id)  # the state before the cell's first change: its history id
        return copy

    def take_taken(self) -> dict[str, str]:
        taken, self.taken = self.taken, {}
        return taken

    def _known(self, index: os.stat_result) -> deque[tuple[str, int]]:
        """The copies there: read once, and again whenever the index changed under us (a restore by
        the host, another kernel of this workspace), so pruning and compaction count their copies too."""
        if self._copies is None or _identity(index) != self._index_seen:
            found = []
            for entry in os.scandir(self.directory):
                if not entry.name.startswith(INDEX) and entry.is_file(follow_symlinks=False):
                    found.append((entry.name, entry.stat(follow_symlinks=False).st_size))
            self._copies = deque(sorted(found))  # names start with their time stamp
            self._bytes = sum(size for _, size in found)
            with open(self.directory / INDEX, "rb") as lines:
                self._index_lines = sum(1 for _ in lines)
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
                entry = history_index.parse_line(line)
                if entry is not None and entry.copy in kept:
                    new.write(line)
                    lines += 1
        os.replace(fresh, index)
        self._index_lines = lines
        self._index_seen = _identity(os.stat(index))


def _identity(st: os.stat_result) -> tuple[int, int]:
    return (st.st_ino, st.st_size)
