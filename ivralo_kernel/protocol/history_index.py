"""[protocol] The history's format, defined once: the write guard writes it, the host reads it and restores.

``<workspace>/.ivralo/history/`` holds one copy per change, named ``<local time>-<ns>-<file name>``
(``20261129-101205-123456789-notes.txt``) so that names sort by time, and ``index.jsonl``, one
JSON object a line:

* ``time``: when the copy was taken, ISO 8601, local, with its offset;
* ``ns``: the same instant in nanoseconds since the epoch (lines written before it existed lack it);
* ``path``: the file's absolute path, as the kernel resolved it;
* ``operation``: what was about to change it (``open for writing``, ``truncate``, ``move onto``,
  ``delete``), or ``restore`` for the state a restore overwrote;
* ``size``: the copy's size in bytes;
* ``copy``: the copy's file name in the folder;
* ``restored`` (``restore`` lines only): the copy that restore put back.

Lines of copies since pruned stay until the index is compacted, so a reader skips a line whose copy
is gone. The folder is writable from the kernel's side, so a reader trusts no line blindly (see
``host/history/store.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from datetime import datetime

INDEX = "index.jsonl"
RESTORE = "restore"
ID_LENGTH = 8  # hex digits shown; any unique prefix of at least MIN_ID_PREFIX is accepted
MIN_ID_PREFIX = 4


@dataclass(frozen=True)
class Entry:
    time: str
    ns: int
    path: str
    operation: str
    size: int
    copy: str
    restored: str | None = None

    @property
    def id(self) -> str:
        return copy_id(self.copy)

    def line(self) -> str:
        fields = {"time": self.time, "ns": self.ns, "path": self.path, "operation": self.operation}
        fields.update(size=self.size, copy=self.copy)  # built by hand: dataclasses.asdict costs the guard's hot path
        if self.restored is not None:
            fields["restored"] = self.restored
        return json.dumps(fields) + "\n"


def copy_id(copy: str) -> str:
    """A short, stable name for a copy: a hash of its file name, which is unique in the folder."""
    return hashlib.blake2s(copy.encode("utf-8", "surrogateescape"), digest_size=ID_LENGTH // 2).hexdigest()


def new_entry(path: str, operation: str, size: int, restored: str | None = None) -> Entry:
    """The entry (and copy name) for a copy of ``path`` taken now."""
    ns = time.time_ns()
    local = time.localtime(ns // 1_000_000_000)
    copy = f"{time.strftime('%Y%m%d-%H%M%S', local)}-{ns % 1_000_000_000:09d}-{os.path.basename(path)}"
    return Entry(time.strftime("%Y-%m-%dT%H:%M:%S%z", local), ns, path, operation, size, copy, restored)


def parse_line(line: str) -> Entry | None:
    """The entry a line of the index holds, or None for a line that is not one (torn, edited, foreign)."""
    try:
        raw = json.loads(line)
        copy, path = raw["copy"], raw["path"]
        if not isinstance(copy, str) or not isinstance(path, str) or not is_plain_name(copy):
            return None
        ns = raw.get("ns")
        if not isinstance(ns, int):  # a line from before ``ns``: its time, to the second
            ns = int(datetime.fromisoformat(raw["time"]).timestamp()) * 1_000_000_000
        restored = raw.get("restored")
        return Entry(
            str(raw["time"]),
            ns,
            path,
            str(raw["operation"]),
            int(raw["size"]),
            copy,
            restored if isinstance(restored, str) else None,
        )
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError, OverflowError, OSError):
        # OverflowError: a size of 1e400 (inf); OSError: a time no platform clock holds; the index is
        # written from the kernel's side, so any line may be in it.
        return None


def is_plain_name(name: str) -> bool:
    """A file name of the folder itself: no separator, not ``.``/``..``, not the index."""
    return bool(name) and os.sep not in name and name not in (".", "..") and not name.startswith(INDEX)
