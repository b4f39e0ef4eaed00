"""[host] Closed paths that do not exist yet: the placeholders that keep them closed.

A read-only mount closes a path only where something is there to mount over. A missing ``.git``,
``.vscode`` or ``~/.ssh`` could be created by the kernel in its writable workspace, and run on the
host later (a new ``.git`` whose ``core.fsmonitor`` runs at the person's next ``git status``). So,
as sandbox-runtime does, each missing closed path gets a placeholder on the host before the sandbox
is built, mounted read-only inside: an empty directory, or for the few files a person's own tools
read where an empty directory would be an error (shell profiles in ``$HOME``), a file that means what
no file meant.

The placeholders are removed when the last sandboxed kernel of the workspace ends. Removing a mount
point on the host detaches it in every other namespace that has it, so a live sandbox of the same
workspace would lose it: each kernel holds a shared lock for its life, and only a host that gets the
exclusive one (no kernel of the workspace left) removes anything. The locks live under ``/tmp``,
which no sandbox sees; the record of what was made lives in ``.ivralo/`` (read-only inside), so a
host that was killed leaves nothing behind for good: the next last kernel removes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.sandbox.closed_names import DIR, FILE, HOME_FILES, TOOL_FILES, TOOL_FILES_DEFAULT

__all__ = ["HOME_FILES", "TOOL_FILES", "TOOL_FILES_DEFAULT", "Placeholder", "WorkspaceClaim", "placeholder_for"]

log = logging.getLogger(__name__)

RECORD = "placeholders.jsonl"  # in .ivralo/: one line per placeholder a host made
LOCK_ROOT = "/tmp"  # noqa: S108 - hidden in every sandbox: no kernel can take these locks


@dataclass(frozen=True)
class Placeholder:
    path: str  # absolute, the first missing component of a closed path
    kind: str  # DIR or FILE
    content: str = ""

    def make(self) -> bool:
        """Made now (True), or already there (False). Raises OSError where it cannot be made."""
        try:
            if self.kind == DIR:
                os.mkdir(self.path, 0o700)
            else:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    f.write(self.content)
        except FileExistsError:
            return False
        return True

    def still_ours(self, dev: int, ino: int) -> bool:
        """The same inode, and still as it was made (nobody has put anything in it since)."""
        try:
            st = os.lstat(self.path)
        except OSError:
            return False
        if (st.st_dev, st.st_ino) != (dev, ino):
            return False
        if self.kind == DIR:
            return stat.S_ISDIR(st.st_mode)
        if not stat.S_ISREG(st.st_mode) or st.st_size != len(self.content.encode()):
            return False
        try:
            with open(self.path, encoding="utf-8") as f:
                return f.read() == self.content
        except (OSError, UnicodeDecodeError):
            return False

    def remove(self) -> None:
        with contextlib.suppress(OSError):  # a folder the person has filled since stays theirs
            (os.rmdir if self.kind == DIR else os.unlink)(self.path)


def _first_missing(path: str) -> str | None:
    """The first component of ``path`` that does not exist (None when all do)."""
    if os.path.lexists(path):
        return None
    head = os.path.dirname(path)
    while head != path and not os.path.lexists(head):
        path, head = head, os.path.dirname(head)
    return path


def placeholder_for(path: str, kind: str = DIR, content: str = "") -> Placeholder | None:
    """What keeps a missing ``path`` closed: itself, or its first missing folder (a directory)."""
    first = _first_missing(path)
    if first is None:
        return None
    return Placeholder(first, kind, content) if first == path else Placeholder(first, DIR)


class WorkspaceClaim:
    """One sandboxed kernel's hold on its workspace's placeholders, from before its sandbox is built
    until it has ended (``release``)."""

    def __init__(self, workspace: str) -> None:
        self.workspace = workspace
        self._users: int | None = None  # a shared lock on the users' file while the kernel may live
        self.links: dict[str, str] = {}  # closed names that were links at start: where each pointed
        base = os.path.join(LOCK_ROOT, f"ivralo-closed-{os.geteuid()}")
        os.makedirs(base, mode=0o700, exist_ok=True)
        st = os.lstat(base)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise OSError(
                f"{base} is not a folder of this user's: ivralo keeps the locks of its placeholders there (see "
                "docs/workspace-files.md). Remove it (it holds only lock files) and start the kernel again."
            )
        key = hashlib.sha256(os.path.realpath(workspace).encode()).hexdigest()[:24]
        self._users_path = os.path.join(base, f"{key}.users")
        self._edit_path = os.path.join(base, f"{key}.edit")

    def _open(self, path: str) -> int:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)

    @contextlib.contextmanager
    def _editing(self) -> Iterator[None]:
        fd = self._open(self._edit_path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def hold(self, placeholders: Iterable[Placeholder]) -> list[Placeholder]:
        """Take this kernel's share of the workspace and make the placeholders missing now; returns
        the ones that exist (made now or earlier), to be mounted read-only."""
        made: list[tuple[Placeholder, os.stat_result]] = []
        present: list[Placeholder] = []
        with self._editing():
            if self._users is None:
                self._users = self._open(self._users_path)
                fcntl.flock(self._users, fcntl.LOCK_SH)
            for placeholder in placeholders:
                try:
                    if placeholder.make():
                        made.append((placeholder, os.lstat(placeholder.path)))
                except OSError:  # a folder the host cannot write to: the kernel cannot either
                    continue
                present.append(placeholder)
            if made:
                self._record(made)
        return present

    def _record(self, made: list[tuple[Placeholder, os.stat_result]]) -> None:
        lines = "".join(
            json.dumps({"path": p.path, "kind": p.kind, "content": p.content, "dev": st.st_dev, "ino": st.st_ino})
            + "\n"
            for p, st in made
        )
        path = os.path.join(self.workspace, names.STATE_DIR, RECORD)
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "a", encoding="utf-8") as f:
                f.write(lines)

    def note_links(self, links: dict[str, str]) -> None:
        """Closed names that are links now: the sandbox closes where they point, and the host mounts each
        link over itself (protocol/sandbox/link_mounts.py); one that still changed is named at the end."""
        for path, target in links.items():
            self.links.setdefault(path, target)

    def replaced_links(self) -> list[str]:
        """The closed links that are no longer the link they were at start (a kernel can replace one)."""
        changed = []
        for path, target in self.links.items():
            try:
                same = os.readlink(path) == target
            except OSError:
                same = False
            if not same:
                changed.append(path)
        return changed

    def release(self) -> None:
        """The kernel has ended: give up its share; the last one out removes the placeholders."""
        if self._users is None:
            return
        for path in self.replaced_links():
            log.warning(
                "ivralo: %r was a link to %r when the kernel started and is not now: code in the kernel may have "
                "replaced it (where the host could not mount the link over itself, the log said so at the start), or "
                "you changed it. Look at it before an editor or a shell opens this folder.",
                path,
                self.links[path],
            )
        os.close(self._users)
        self._users = None
        with self._editing():
            probe = self._open(self._users_path)
            try:
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # another kernel of this workspace still lives: its mounts stay
            else:
                remove_recorded(self.workspace)
            finally:
                os.close(probe)


def remove_recorded(workspace: str) -> None:
    """Remove the placeholders a host recorded for ``workspace`` that are still as it made them. Call
    only where no sandbox of the workspace lives (see ``WorkspaceClaim.release``)."""
    path = os.path.join(workspace, names.STATE_DIR, RECORD)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    root = os.path.realpath(workspace).rstrip(os.sep) + os.sep
    # Deepest first, so a folder made for a deeper path goes after what was made in it.
    entries = []
    for line in lines:
        try:
            entry = json.loads(line)
            placeholder = Placeholder(str(entry["path"]), str(entry["kind"]), str(entry.get("content", "")))
            dev, ino = int(entry["dev"]), int(entry["ino"])
        except (ValueError, KeyError, TypeError):
            continue
        if placeholder.path.startswith(root) and placeholder.kind in (DIR, FILE):
            entries.append((placeholder, dev, ino))
    for placeholder, dev, ino in sorted(entries, key=lambda e: -len(e[0].path)):
        if placeholder.still_ours(dev, ino):
            placeholder.remove()
    with contextlib.suppress(OSError):
        os.unlink(path)
