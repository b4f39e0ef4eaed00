"""[kernel] Which files of the workspace a cell created, changed or deleted, whoever did it: Python,
``!sh``, a subprocess, native code.

Linux's inotify on every folder of the workspace (``.ivralo`` and ``.git`` left out: the host's and
the guards' own records). The kernel reads the queued events when a cell ends, so the cost is per
event, not per file in the workspace: a cell that touches nothing costs one ``read`` that finds
nothing. Events between cells (a person's editor) are read and dropped when the next cell starts.
The first walk, which adds the watches, runs in a thread after start-up, off the kernel's way to
ready.

Not a security boundary: a process can outrun it (a folder created and filled before its watch is
added is scanned at once; a file written and deleted within that gap is missed), and past
``MAX_FOLDERS`` folders, or when the event queue overflows, it says so instead of guessing.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import threading
from dataclasses import dataclass, field

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
MASK = IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF
EVENT = struct.Struct("iIII")
SKIP = frozenset({".ivralo", ".git"})
MAX_FOLDERS = 20_000  # watches are a per-user kernel resource (fs.inotify.max_user_watches)


@dataclass
class FileChanges:
    created: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    unwatched: str = ""  # why the list may be incomplete, when it may


class WorkspaceWatch:
    def __init__(self, workspace: str) -> None:
        self.workspace = os.path.realpath(workspace)
        self._fd = -1
        self._folders: dict[int, str] = {}  # watch descriptor -> folder, relative to the workspace
        self._unwatched = ""
        self._ready = threading.Event()
        self._first: dict[str, int] = {}  # this cell's paths -> what their first event was
        self._exists: dict[str, bool] = {}  # ... and whether each exists after its last one
        self._libc: ctypes.CDLL | None = None

    def start(self) -> None:
        """Add the watches in a thread: the kernel does not wait for the walk to become ready."""
        threading.Thread(target=self._walk, name="ivralo-workspace-watch", daemon=True).start()

    def _walk(self) -> None:
        try:
            libc = self._libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)  # children do not inherit it
            if fd < 0:
                self._unwatched = f"inotify is not available ({os.strerror(ctypes.get_errno())})"
                return
            self._fd = fd
            self._add_tree("")
        except Exception as exc:  # noqa: BLE001 - the effects say why they lack files, the kernel runs on
            self._unwatched = f"the workspace could not be watched ({type(exc).__name__}: {exc})"
        finally:
            self._ready.set()

    def _add_tree(self, relative: str, report: bool = False) -> None:
        """Watch ``relative`` and every folder below it; with ``report``, what is already in them is
        created (a folder made during the cell, filled before its watch was added)."""
        stack = [relative]
        while stack:
            folder = stack.pop()
            if not self._watch(folder):
                return
            try:
                entries = list(os.scandir(os.path.join(self.workspace, folder)))
            except OSError:
                continue
            for entry in entries:
                path = os.path.join(folder, entry.name) if folder else entry.name
                if entry.is_dir(follow_symlinks=False):
                    if not folder and entry.name in SKIP:
                        continue
                    stack.append(path)
                elif report:
                    self._note(path, IN_CREATE, exists=True)

    def _watch(self, folder: str) -> bool:
        if len(self._folders) >= MAX_FOLDERS:
            self._unwatched = f"the workspace has more than {MAX_FOLDERS} folders; only the first are watched"
            return False
        assert self._libc is not None
        path = os.path.join(self.workspace, folder).encode()
        wd = self._libc.inotify_add_watch(self._fd, path, MASK | IN_ONLYDIR)
        if wd < 0:
            code = ctypes.get_errno()
            if code == errno.ENOSPC:
                self._unwatched = "the system's inotify watch limit is reached (fs.inotify.max_user_watches)"
                return False
            return True  # gone already, or not a folder: nothing to watch
        self._folders[wd] = folder
        return True

    # -- per cell ---------------------------------------------------------------------------
    def begin(self) -> None:
        """A cell starts: what happened since the last one is not its doing."""
        if self._ready.is_set():
            self._read()
        self._first.clear()
        self._exists.clear()

    def end(self) -> FileChanges:
        if not self._ready.is_set():
            return FileChanges(unwatched="the workspace's watches were still being added")
        self._read()
        changes = FileChanges(unwatched=self._unwatched)
        for path, first in sorted(self._first.items()):
            exists = self._exists[path]
            new = first in (IN_CREATE, IN_MOVED_TO)
            if new and exists:
                changes.created.append(path)
            elif not new and exists:
                changes.changed.append(path)
            elif not new and not exists:
                changes.deleted.append(path)
            # created and deleted within the cell (a temporary file): not an effect
        return changes

    def _note(self, path: str, kind: int, exists: bool) -> None:
        self._first.setdefault(path, kind)
        self._exists[path] = exists

    def _read(self) -> None:
        if self._fd < 0:
            return
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return
            except OSError as exc:
                self._unwatched = f"reading the workspace's events failed ({exc.strerror})"
                return
            offset = 0
            while offset < len(data):
                wd, mask, _cookie, length = EVENT.unpack_from(data, offset)
                raw = data[offset + EVENT.size : offset + EVENT.size + length]
                offset += EVENT.size + length
                self._event(wd, mask, raw.rstrip(b"\0").decode(errors="surrogateescape"))

    def _event(self, wd: int, mask: int, name: str) -> None:
        if mask & IN_Q_OVERFLOW:
            self._unwatched = "too many changes at once: the event queue overflowed, some files are missing"
            return
        folder = self._folders.get(wd)
        if folder is None:
            return
        if mask & (IN_IGNORED | IN_DELETE_SELF):
            self._folders.pop(wd, None)
            return
        path = os.path.join(folder, name) if folder else name
        if mask & IN_ISDIR:
            if mask & (IN_CREATE | IN_MOVED_TO) and not (not folder and name in SKIP):
                self._add_tree(path, report=True)
            return
        if mask & (IN_CREATE | IN_MOVED_TO):
            self._note(path, mask & (IN_CREATE | IN_MOVED_TO), exists=True)
        elif mask & (IN_DELETE | IN_MOVED_FROM):
            self._note(path, mask & (IN_DELETE | IN_MOVED_FROM), exists=False)
        elif mask & (IN_MODIFY | IN_CLOSE_WRITE):
            self._note(path, IN_MODIFY, exists=True)
