"""[host] The workspace files the host trusts, and whether a kernel changed them.

``.env``, ``databases.json`` and ``.ivralo/permissions.json`` are read by the host and shape what it
does for the kernel (values, databases, hosts allowed). They sit in the workspace, which is the
kernel's to write: in the sandbox most are read-only mounts, but a file that did not exist at start
can be created, and without the sandbox a shell line writes any of them. So the host notes each
file's digest when a kernel starts, and compares:

- **while the kernel runs**, before each use: a file that no longer matches (and that the host did
  not write itself, e.g. an "always" answer in permissions.json) is not used for the rest of the
  run;
- **when the kernel ends**, or at the next start if its host died: a file changed meanwhile is
  recorded as changed, and the next start ignores it, saying so in one line, until the person
  approves it (``ivralo-kernel trust FOLDER``). A later edit by the person (made while no kernel
  ran) replaces the changed content and is used again.

A file the sandbox keeps read-only for this kernel (``protected``: ``.ivralo/`` always, ``.env`` and
``databases.json`` when they existed at start) cannot have been changed by it: a change there is
the person's, used at once and never recorded. The record lives in the config home
(``watched-files.json``), out of the kernel's reach.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.credentials import config_home
from ivralo_kernel.protocol.network.egress import PERMISSIONS_FILE

DOTENV, DATABASES, PERMISSIONS = names.DOTENV_FILE, names.DATABASES_FILE, f"{names.STATE_DIR}/{PERMISSIONS_FILE}"
WATCHED = (DOTENV, DATABASES, PERMISSIONS)
RECORD_FILE = "watched-files.json"
_ABSENT = "absent"


def digest(path: Path) -> str:
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):  # a directory: the sandbox's placeholder, no file
        return _ABSENT
    except OSError:
        return "unreadable"
    # An empty file is read as no file (config_files.read_json_file, the .env reader), and it is the
    # sandbox's placeholder for a missing databases.json: left by a crashed kernel, it is no change.
    return hashlib.sha256(data).hexdigest() if data else _ABSENT


# What ``stamp`` returns: (device, inode, size, mtime, ctime), None for a missing file.
Stamp = tuple[int, int, int, int, int] | None
# A file whose status changed less than this long ago may change again within the same timestamp
# tick without its stamp showing it (Linux stamps files from a coarse clock: one tick, 10 ms at most),
# so it is not cached until it is older. Any change after that moves its ctime past the cached one.
SETTLED_NS = 100_000_000


def stamp(path: str | os.PathLike[str]) -> Stamp | bool:
    """What tells a read of ``path`` from the next one without reading it: None when it is missing;
    False when it cannot be told (it cannot be stat'ed, or it changed too recently: see
    ``settled``), so the caller reads it afresh. The ctime is in it because nothing outside the
    kernel's own clock sets it: code that rewrites a file and puts its mtime back still moves it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError:
        return False
    if time.time_ns() - st.st_ctime_ns < SETTLED_NS:
        return False
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def changed_line(rel: str, workspace: str) -> str:
    return (
        f"{rel} was changed while a kernel of this workspace ran (code in it can write there), so it "
        f"is ignored until you approve it: ivralo-kernel trust {workspace}"
    )


class WorkspaceFiles:
    """One kernel's view of its workspace's watched files (the host's side; thread-safe)."""

    def __init__(self, workspace: str, env: Mapping[str, str] = os.environ) -> None:
        self.workspace = os.path.realpath(workspace)
        self._record = config_home(env) / RECORD_FILE
        self._tag = f"{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self._lock = threading.Lock()
        self.ignored: set[str] = set()  # not used in this run (changed before, or during it)
        self.lines: list[str] = []
        self._noted: dict[str, str] = {}
        self._protected: frozenset[str] = frozenset()
        # rel -> the settled stamp under which its digest last matched the noted one
        self._verified: dict[str, Stamp | bool] = {}

    def _path(self, rel: str) -> Path:
        return Path(self.workspace, rel)

    # -- at start and at end -----------------------------------------------------------------
    def begin(self, protected: frozenset[str] = frozenset()) -> list[str]:
        """Note the digests; returns the lines to show for files that stay ignored. ``protected``:
        the files this kernel cannot write (read-only mounts)."""
        self._protected = protected
        with self._records() as records:
            mine = records.setdefault(self.workspace, {"running": {}, "changed": {}})
            _recover(mine, self.workspace)
            current = {rel: digest(self._path(rel)) for rel in WATCHED}
            for rel, seen in current.items():
                changed = mine["changed"].get(rel)
                if changed is None:
                    continue
                if changed == seen:
                    self.ignored.add(rel)
                    self.lines.append(changed_line(rel, self.workspace))
                else:
                    del mine["changed"][rel]  # edited since, while no kernel ran: the person's
            self._noted = {rel: seen for rel, seen in current.items() if rel not in protected}
            mine["running"][self._tag] = self._noted
        return list(self.lines)

    def end(self) -> None:
        """The kernel is gone: what changed during its run is recorded as changed."""
        with self._records() as records:
            mine = records.setdefault(self.workspace, {"running": {}, "changed": {}})
            noted = mine["running"].pop(self._tag, self._noted)
            _taint(mine, self.workspace, noted)
            if not mine["running"] and not mine["changed"]:
                del records[self.workspace]

    # -- while it runs -----------------------------------------------------------------------
    def usable(self, rel: str) -> bool:
        """Whether the host may use this file now: not ignored, and as it was at start."""
        with self._lock:
            if rel in self.ignored:
                return False
            if rel not in self._noted:
                return True
            # Digested again only when its stamp moved (or cannot be trusted): the digest of a file
            # the host reads at each request was most of what judging a request cost.
            seen = stamp(self._path(rel))
            if seen is not False and self._verified.get(rel, False) == seen:
                return True
            if digest(self._path(rel)) != self._noted[rel]:
                self.ignored.add(rel)
                self.lines.append(changed_line(rel, self.workspace))
                return False
            self._verified[rel] = seen  # taken before the digest: a change after it moves the stamp
            return True

    @contextlib.contextmanager
    def host_writes(self, rel: str) -> Iterator[None]:
        """The host itself changes the file inside this block (an "always" answer): its new content
        is the noted one. The lock spans the write, so no ``usable`` in between sees a change that
        is the host's own and sets the file aside."""
        with self._lock:
            yield
            if rel in self._protected:
                return
            self._noted[rel] = digest(self._path(rel))
            self._verified.pop(rel, None)
        with self._records() as records:
            running = records.get(self.workspace, {}).get("running", {})
            if self._tag in running:
                running[self._tag][rel] = self._noted[rel]

    @contextlib.contextmanager
    def _records(self) -> Iterator[dict[str, Any]]:
        """The record, locked against other hosts for the read-modify-write (a lock file beside it:
        the record itself is replaced whole, so that a host killed while writing leaves the last one)."""
        self._record.parent.mkdir(parents=True, exist_ok=True)
        with open(f"{self._record}.lock", "a", encoding="utf-8") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                records = json.loads(self._record.read_text(encoding="utf-8") or "{}")
            except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
                records = {}
            if not isinstance(records, dict):
                records = {}
            # A workspace folder that is gone has nothing left to watch: its record goes too (else the
            # record grows with every folder a kernel ever ran in, and each start reads all of it).
            for gone in [ws for ws in records if ws != self.workspace and not os.path.isdir(ws)]:
                del records[gone]
            yield records
            fresh = self._record.with_name(f".{self._record.name}.{os.getpid()}.new")
            fresh.write_text(json.dumps(records, indent=1, sort_keys=True), encoding="utf-8")
            os.replace(fresh, self._record)


def protected_in_sandbox(workspace: str) -> frozenset[str]:
    """What a sandboxed kernel cannot write: ``.ivralo/`` (made before the start, mounted read-only),
    and ``.env`` and ``databases.json`` when they exist at start (read-only mounts). A missing
    ``databases.json`` is closed by a placeholder, but stays watched: a person who deletes the
    placeholder while the kernel runs detaches its mount."""
    present = {rel for rel in (DOTENV, DATABASES) if os.path.isfile(os.path.join(workspace, rel))}
    return frozenset({PERMISSIONS, *present})


def approve(workspace: str, env: Mapping[str, str] = os.environ) -> list[str]:
    """The person approves the workspace's files as they are now; returns the ones that were ignored."""
    files = WorkspaceFiles(workspace, env)
    with files._records() as records:
        mine = records.get(files.workspace)
        if not mine:
            return []
        approved = sorted(mine.get("changed", {}))
        mine["changed"] = {}
        if not mine.get("running"):
            del records[files.workspace]
    return approved


def _recover(mine: dict[str, Any], workspace: str) -> None:
    """Runs whose host died without an end: compared now, as their end would have."""
    for tag in list(mine["running"]):
        pid = int(tag.split(":", 1)[0])
        if not _alive(pid):
            _taint(mine, workspace, mine["running"].pop(tag))


def _taint(mine: dict[str, Any], workspace: str, noted: Mapping[str, str]) -> None:
    for rel, seen in noted.items():
        now = digest(Path(workspace, rel))
        if now != seen and now != _ABSENT:
            mine["changed"][rel] = now


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
