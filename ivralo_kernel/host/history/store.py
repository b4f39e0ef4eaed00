"""[host] Listing and restoring the copies the write guard keeps in ``<workspace>/.ivralo/history/``.

Restoring is the person's or the host's act (``ivralo-kernel history``, ``Session.history()`` and
``Session.restore()``); the kernel still cannot read ``.ivralo/``. The format is
``protocol/history_index.py``.

The folder is writable from the kernel's side (its copies are written there), so nothing read from
it is trusted: what is listed and restored is what the host recorded (``host/history/ledger.py``:
a ledger in the config home, each copy with its hash, recorded while the kernel that made it ran),
never the folder's index alone. A copy is opened without following links, must be a regular file
with one link and still hold the bytes the host recorded; a restore writes only inside the
workspace, never onto a closed path (``.git``, ``.ivralo``, ``databases.json``, the tool files, a
``.env`` file: ``history_ledger.closed_reason``), and walks the folders to the file by descriptor,
without following links, so a link swapped in cannot send it elsewhere.

**A newer change** (what a restore refuses to overwrite without ``force``): the copy holds the file
as it was just before a change; that change made the file as it is now, unless something changed it
since. Something did when

* the history holds a later copy of the same path (the kernel changed it again, or it was restored), or
* the file is there and was modified more than ``GRACE_S`` after the copy was taken (an edit from
  outside the kernel: an editor, a shell; the change itself ends within moments of its copy), or
* the change was a delete and the file exists again.

A missing file is no newer change (nothing would be overwritten). Whatever a restore overwrites is
first kept as a copy itself (operation ``restore``), so every restore can be undone.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import stat
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ivralo_kernel.host.history.files import (
    CREATE,
    FOLDER,
    READ,
    current_file,
    holds,
    why_unreadable,
    write_all,
    write_atomically,
)
from ivralo_kernel.host.history.ledger import (
    HistoryLedger,
    Recorded,
    closed_reason,
    copy_digest,
    home_inside,
    inside_path,
    read_index,
)
from ivralo_kernel.protocol import IvraloError, names
from ivralo_kernel.protocol.history_index import (
    INDEX,
    MIN_ID_PREFIX,
    RESTORE,
    Entry,
    copy_id,
    new_entry,
)
from ivralo_kernel.protocol.sandbox.closed_names import TOOL_FILES_DEFAULT

GRACE_S = 2.0  # a change ends this soon after its copy; a later modification is someone else's


class HistoryError(IvraloError):
    """A copy cannot be found, read or restored; the message says why and what to do."""


class NewerChangeError(HistoryError):
    """The file changed after the change the copy undoes; restore again with ``force``."""


@dataclass
class Restored:
    """What a restore did. ``kept`` is the copy of the state it overwrote (None: there was none)."""

    entry: Entry
    path: str  # relative to the workspace
    size: int
    kept: Entry | None = None
    unchanged: bool = False  # the file already held these bytes: nothing written
    created: list[str] = field(default_factory=list)  # folders made on the way (relative)

    def as_dict(self) -> dict[str, Any]:
        return {
            "restored": self.entry.id,
            "path": self.path,
            "size": self.size,
            "kept": self.kept.id if self.kept else None,
            "unchanged": self.unchanged,
            "created_folders": list(self.created),
            "message": self.describe("restore({id!r})"),
        }

    def describe(self, undo: str) -> str:
        """What was done, in sentences; ``undo`` is how to run a restore of an ID (``{id}``)."""
        taken = f"copy {self.entry.id}, taken {local_time(self.entry.ns)} before {described(self.entry)}"
        if self.unchanged:
            return f"{self.path} already holds {taken}: nothing to restore."
        lines = [f"Restored {self.path} ({human_size(self.size)}) from {taken}."]
        if self.created:
            lines.append(f"Made the folder{'s' if len(self.created) > 1 else ''} {', '.join(self.created)} again.")
        if self.kept is not None:
            lines.append(
                f"The state it replaced is kept as copy {self.kept.id}: {undo.format(id=self.kept.id)} "
                "undoes this restore."
            )
        return "\n".join(lines)


def find_workspace(start: str) -> str:
    """The nearest folder from ``start`` upward that has a history (as git finds ``.git``); else ``start``."""
    folder = os.path.realpath(start if os.path.isdir(start) else os.path.dirname(os.path.abspath(start)))
    probe = folder
    while True:
        if os.path.isdir(os.path.join(probe, names.HISTORY_DIR)):
            return probe
        parent = os.path.dirname(probe)
        if parent == probe:
            return folder
        probe = parent


def described(entry: Entry) -> str:
    """The change a copy was taken before, as a sentence's end."""
    if entry.operation != RESTORE:
        return repr(entry.operation)
    return f"a restore (of copy {copy_id(entry.restored)})" if entry.restored else "a restore"


def local_time(ns: int) -> str:
    """The time as a person reads it: local, to the second (also what ``--at`` accepts)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9))


def human_size(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def parse_time(text: str) -> int:
    """``--at``'s TIME in nanoseconds: ISO 8601 or the list's format (local unless it has an offset),
    or a time of day (today)."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        try:
            clock = datetime.strptime(text.strip(), "%H:%M:%S" if text.count(":") == 2 else "%H:%M").time()
        except ValueError:
            raise HistoryError(
                f"{text!r} is not a time: give it as the history list shows it (2026-11-29 10:12:05), as ISO 8601 "
                "(2026-11-29T10:12:05+01:00), or as a time of day today (10:12)"
            ) from None
        when = datetime.combine(datetime.now().date(), clock)
    return int(when.astimezone().timestamp() * 1e9)


class HistoryStore:
    """The kept copies of one workspace."""

    def __init__(
        self,
        workspace: str | os.PathLike[str],
        tool_files: Iterable[str] = TOOL_FILES_DEFAULT,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.workspace = os.path.realpath(workspace)
        self.directory = os.path.join(self.workspace, names.HISTORY_DIR)
        self.tool_files = tuple(tool_files)
        self.ledger = HistoryLedger(self.workspace, env)

    # Reading ---------------------------------------------------------------------------------------
    def entries(self) -> list[Entry]:
        """Every copy the host recorded that is still there, newest first (the folder's own index is
        the kernel's to write: a line the host did not record is not listed)."""
        try:
            recorded = self.ledger.recorded()
        except OSError as exc:
            raise HistoryError(f"cannot read the host's record of this history ({self.ledger.path}): {exc}") from None
        found = [r.entry for r in recorded.values() if self._copy_is_there(r.entry)]
        return sorted(found, key=lambda e: (e.ns, e.copy), reverse=True)

    def unrecorded(self) -> int:
        """Lines of the folder's index the host never recorded (written while no host of ivralo watched,
        or refused when it did): not listed, never restored."""
        known = self.ledger.recorded()
        return sum(1 for e in self._index_lines() if e.copy not in known)

    def _index_lines(self) -> list[Entry]:
        """The folder's own index, as the kernel's side wrote it: only ever used to explain a refusal."""
        return read_index(self.directory)

    def listing(self, path: str | None = None, base: str | None = None) -> list[Entry]:
        """The copies of ``path`` (a file, or every file under a folder), or all; newest first.
        A relative ``path`` is taken from ``base`` (default: the current folder)."""
        entries = self.entries()
        if path is None:
            return entries
        wanted = self.resolve(path, base)
        return [e for e in entries if e.path == wanted or e.path.startswith(wanted.rstrip(os.sep) + os.sep)]

    def resolve(self, path: str, base: str | None = None) -> str:
        full = os.path.join(base if base is not None else os.getcwd(), os.path.expanduser(path))
        head, tail = os.path.split(os.path.abspath(full))
        return os.path.join(os.path.realpath(head), tail) if tail else os.path.realpath(head)

    def find(self, ident: str) -> Entry:
        """The copy with this ID (or a unique prefix of it, at least 4 characters), or this copy file name."""
        ident = ident.strip()
        entries = self.entries()
        exact = [e for e in entries if e.copy == ident or e.id == ident.lower()]
        matches = exact or (
            [e for e in entries if e.id.startswith(ident.lower())] if len(ident) >= MIN_ID_PREFIX else []
        )
        if len(matches) == 1:
            return matches[0]
        if matches:
            shown = ", ".join(f"{e.copy}" for e in matches[:5])
            raise HistoryError(
                f"the ID {ident} names {len(matches)} kept copies ({shown}). Give the copy's whole file name instead"
            )
        planted = [e for e in self._index_lines() if e.copy == ident or e.id == ident.lower()]
        if planted:
            raise HistoryError(
                f"the folder's index has a line for {ident} (copy {planted[0].copy!r}), but the host never recorded "
                "that copy: it was not made by the write guard while a kernel of ivralo ran here (planted, copied "
                "in with the folder, or refused: a closed path, a link), so it is not listed or restored. Nothing "
                f"was changed; read it in {names.HISTORY_DIR}/ yourself if you trust it"
            )
        raise HistoryError(
            f"no kept copy has the ID {ident} in {self.workspace}. `ivralo-kernel history list` shows the IDs "
            "(the oldest copies are pruned first, once the history reaches its caps)"
        )

    def at(self, path: str, when_ns: int, base: str | None = None) -> Entry:
        """The copy holding ``path`` as it was at ``when_ns``: the first one taken after it (each copy
        holds the file as it was just before a change)."""
        wanted = self.resolve(path, base)
        copies = [e for e in self.entries() if e.path == wanted]
        if not copies:
            raise HistoryError(
                f"{self._shown(wanted)} has no kept copies in {self.workspace}. `ivralo-kernel history list` shows "
                "the files that have some"
            )
        after = [e for e in copies if e.ns > when_ns]
        if not after:
            latest = copies[0]
            raise HistoryError(
                f"{self._shown(wanted)} has no kept copy from after {local_time(when_ns)}: no cell changed it since, "
                f"as far as the history knows, so it is as it was then (its latest copy, {latest.id}, is from "
                f"{local_time(latest.ns)})"
            )
        return after[-1]  # newest first: the last of those after is the first taken

    def read(self, entry: Entry) -> tuple[bytes, int]:
        """The copy's bytes and mode. Refused when it is not a plain file of the folder (a link, a hard
        link), or no longer holds the bytes the host recorded: the folder is writable from the kernel's side."""
        recorded = self.ledger.recorded().get(entry.copy)
        if recorded is None:
            raise HistoryError(
                f"the copy {entry.copy} is not in the host's record of this history: it was not made while a "
                "kernel of ivralo ran here (a line planted in the folder, or copied in with it), so it is not "
                f"restored. Nothing was changed; read {names.HISTORY_DIR}/{entry.copy} yourself if you trust it"
            )
        try:
            with self._opened_dir() as history:
                fd = os.open(entry.copy, READ, dir_fd=history)
        except OSError as exc:
            raise HistoryError(
                f"cannot read the copy {entry.copy}: {why_unreadable(exc)}. Nothing was changed"
            ) from None
        with os.fdopen(fd, "rb") as copy:
            st = os.fstat(copy.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
                raise HistoryError(
                    f"the copy {entry.copy} is not a plain file of the history (a link or a hard link): the write "
                    "guard never makes one, so it is not restored. Nothing was changed"
                )
            content = copy.read()
        if hashlib.sha256(content).hexdigest() != recorded.sha256:
            raise HistoryError(
                f"the copy {entry.copy} no longer holds the bytes the host recorded when it was taken (it was "
                "rewritten since, from the kernel's side), so it is not restored. Nothing was changed"
            )
        return content, stat.S_IMODE(st.st_mode) & 0o777

    def relative(self, entry_or_path: Entry | str) -> str:
        path = entry_or_path.path if isinstance(entry_or_path, Entry) else entry_or_path
        return self._shown(path)

    def current(self, entry: Entry) -> os.stat_result | None:
        try:
            return os.lstat(entry.path)
        except OSError:
            return None

    def newer_change(self, entry: Entry, now: os.stat_result | None = None) -> str | None:
        """Why the file has changed since the change this copy undoes (None: it has not). See the module."""
        later = [e for e in self.entries() if e.path == entry.path and (e.ns, e.copy) > (entry.ns, entry.copy)]
        rel = self._shown(entry.path)
        if later:
            newest = later[0]
            more = f"{len(later)} later copies" if len(later) > 1 else "a later copy"
            return (
                f"{rel} was changed again after copy {entry.id} was taken: the history holds {more} of it (the "
                f"newest, {newest.id}, from {local_time(newest.ns)}, before {newest.operation!r})"
            )
        now = now if now is not None else self.current(entry)
        if now is None:
            return None
        if entry.operation == "delete":
            return f"{rel} was deleted by the change copy {entry.id} undoes, and has been created again since"
        if now.st_mtime_ns > entry.ns + GRACE_S * 1e9:
            return (
                f"{rel} was modified at {local_time(now.st_mtime_ns)}, after the change copy {entry.id} undoes "
                f"({entry.operation!r} at {local_time(entry.ns)}): by an edit from outside the kernel, or a long write"
            )
        return None

    # Restoring -------------------------------------------------------------------------------------
    def restore(self, entry: Entry, force: bool = False, force_flag: str = "--force") -> Restored:
        """Put the copy back where it was, byte for byte and with its mode, atomically (a temporary
        file in the same folder, then a rename). Whatever it overwrites is kept as a copy first."""
        rel = self._target(entry)
        content, mode = self.read(entry)
        result = Restored(entry, rel, len(content))
        now = self.current(entry)
        if holds(entry.path, now, content):
            result.unchanged = True
            return result
        if not force:
            why = self.newer_change(entry, now)
            if why is not None:
                raise NewerChangeError(
                    f"{why}. Restoring would overwrite that newer change, so nothing was changed. To restore "
                    f"anyway, add {force_flag} (the state it overwrites is kept as a copy too)"
                )
        folders, name = os.path.split(rel)
        with self._folder(folders, result.created) as parent:
            try:
                now, current = current_file(parent, name)
            except IsADirectoryError:
                raise HistoryError(
                    f"{rel} is a folder now, so no file is restored over it. Nothing was changed"
                ) from None
            if current is not None and now is not None:
                result.kept = self._keep(entry, current, now)
            write_atomically(parent, name, content, mode)
        return result

    def _target(self, entry: Entry) -> str:
        """The restore's target relative to the workspace, once it is one the write guard could have kept."""
        path = entry.path
        rel = inside_path(self.workspace, path)
        if rel is None:
            raise HistoryError(
                f"copy {entry.id} was taken of {path}, which is not inside the workspace {self.workspace} (the "
                "workspace was moved or renamed, or the line is not the write guard's). Nothing was changed; copy "
                f"it out of {names.HISTORY_DIR}/{entry.copy} yourself if you need it"
            )
        why = closed_reason(rel, self.tool_files, home_inside(self.workspace))
        if why is not None:
            raise HistoryError(
                f"copy {entry.id} would be restored to {rel}, where code may not write ({why}; closed: .git, "
                ".ivralo, databases.json, .env and the tool_files setting's), so no restore writes there. Nothing "
                "was changed"
            )
        return rel

    @contextmanager
    def _opened_dir(self) -> Iterator[int]:
        fd = os.open(self.directory, FOLDER)
        try:
            yield fd
        finally:
            os.close(fd)

    @contextmanager
    def _folder(self, rel: str, created: list[str]) -> Iterator[int]:
        """A descriptor of the workspace's folder ``rel``, walked without following links; folders
        missing on the way (a tree deleted since) are made again."""
        fd = os.open(self.workspace, FOLDER)
        try:
            walked = ""
            for part in [p for p in rel.split(os.sep) if p]:
                walked = os.path.join(walked, part)
                try:
                    nxt = os.open(part, FOLDER, dir_fd=fd)
                except FileNotFoundError:
                    os.mkdir(part, 0o777, dir_fd=fd)
                    created.append(walked)
                    nxt = os.open(part, FOLDER, dir_fd=fd)
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    raise HistoryError(
                        f"{walked} is no longer a folder (it is a link or a file now), so nothing is restored "
                        "through it. Nothing was changed; move it aside and restore again"
                    ) from None
                os.close(fd)
                fd = nxt
            yield fd
        finally:
            os.close(fd)

    def _keep(self, restoring: Entry, content: bytes, now: os.stat_result) -> Entry:
        """Keep the state a restore is about to overwrite, as the write guard keeps a cell's change."""
        kept = new_entry(restoring.path, RESTORE, len(content), restored=restoring.copy)
        with self._opened_dir() as history:
            fd = os.open(kept.copy, CREATE, 0o600, dir_fd=history)
            try:
                write_all(fd, content)
                os.fchmod(fd, stat.S_IMODE(now.st_mode) & 0o777)
                os.utime(fd, ns=(now.st_atime_ns, now.st_mtime_ns))  # as shutil.copy2 keeps them
            finally:
                os.close(fd)
            # One append of one line: the running kernel sees the index change and reads the folder again.
            index = os.open(
                INDEX, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=history
            )
            try:
                write_all(index, kept.line().encode("utf-8"))
            finally:
                os.close(index)
            digest = copy_digest(history, kept.copy)
        if digest is not None:  # the host made it: recorded as it wrote it
            self.ledger.add([Recorded(dataclasses.replace(kept, size=digest[1]), digest[0])])
        return kept

    def _copy_is_there(self, entry: Entry) -> bool:
        try:
            return stat.S_ISREG(os.lstat(os.path.join(self.directory, entry.copy)).st_mode)
        except OSError:
            return False

    def _shown(self, path: str) -> str:
        if path == self.workspace or path.startswith(self.workspace + os.sep):
            return os.path.relpath(path, self.workspace)
        return path


def entry_dict(store: HistoryStore, entry: Entry) -> dict[str, Any]:
    """One copy as JSON carries it (for agents and ``--json``)."""
    out: dict[str, Any] = {
        "id": entry.id,
        "time": datetime.fromtimestamp(entry.ns / 1e9).astimezone().isoformat(timespec="seconds"),
        "path": store.relative(entry),
        "operation": entry.operation,
        "size": entry.size,
        "copy": f"{names.HISTORY_DIR}/{entry.copy}",
    }
    if entry.restored:
        out["restored"] = entry.restored
    return out
