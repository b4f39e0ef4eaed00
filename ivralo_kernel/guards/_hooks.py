"""[guards] The only module that changes interpreter state: the audit hook and the trust gate.

PEP 578 audit hooks are process-wide and cannot be removed, so ``_socket``, ``importlib.reload``
or a thread started by the user do not walk around them. They are not a security boundary:
ctypes, ``os.open(dir_fd=...)``, symlink races and child processes are (see the Landlock floor).
What they give is a clear refusal, at the line that tried, that tells the code to stop.

The guard's own file operations (copies into the history) run with a thread-local flag set, so
they are not judged; everything else is.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import re
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from ivralo_kernel.guards.fs import FsPolicy, decide_read, decide_start, decide_write, resolve
from ivralo_kernel.guards.history import History
from ivralo_kernel.protocol import GuardRefusal, TrustGateError, audience

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
OWN_PACKAGE = __name__.split(".")[0]
_own = threading.local()


def _path(value: Any) -> str | None:
    if isinstance(value, int) or value is None:
        return None
    try:
        return os.fsdecode(value)
    except TypeError:
        return None


def _resolve_at(value: Any, dir_fd: Any, follow_last: bool = True) -> str | None:
    path = _path(value)
    if path is None:
        return None
    if isinstance(dir_fd, int) and dir_fd >= 0 and not os.path.isabs(path):
        try:  # relative to a directory descriptor (shutil.rmtree does this)
            path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
        except OSError:
            pass
    return resolve(path, follow_last)


def _store_pattern(stores: tuple[str, ...]) -> re.Pattern[str] | None:
    """What a path string naming one of ``stores`` contains: the store's last component when it is a
    dot-name (``.ssh``), else its last two (``.docker/config.json``, ``share/keyrings``)."""
    marks = set()
    for store in stores:
        head, name = os.path.split(store.rstrip(os.sep))
        marks.add(name.lower() if name.startswith(".") else f"{os.path.basename(head)}/{name}".lower())
    return re.compile("|".join(sorted(map(re.escape, marks)))) if marks else None


class FileGuard:
    def __init__(self, policy: FsPolicy, history: History) -> None:
        self.policy, self.history = policy, history
        # The hot path's string test for the credential stores: one search for all of them.
        self._stores = _store_pattern(policy.closed_reads)
        self.starting = True
        self.refusals = 0
        self.started: list[str] = []  # programs started from Python since the last take_started()
        self._handlers: dict[str, Callable[[tuple[Any, ...]], None]] = {
            # Not judged (the sandbox and Landlock bound what they do): recorded for the cell's effects.
            "subprocess.Popen": lambda a: self._started(a[0], a[1], a[2]),
            "os.posix_spawn": lambda a: self._started(a[0], a[1], None),
            "os.exec": lambda a: self._started(a[0], a[1], None),
            "os.system": lambda a: self._started(None, a[0], None),
            "open": self._open,
            "os.remove": lambda a: self._change("delete", _resolve_at(a[0], a[1], False), keep=True),
            "os.rmdir": lambda a: self._change("remove the folder", _resolve_at(a[0], a[1], False)),
            "os.mkdir": lambda a: self._change("create the folder", _resolve_at(a[0], a[2], False)),
            "os.truncate": lambda a: self._change("truncate", _resolve_at(a[0], None), keep=True),
            "os.rename": self._rename,
            "os.symlink": self._symlink,
            "os.link": self._link,
            "shutil.rmtree": lambda a: self._change("delete the tree", _resolve_at(a[0], a[1], False)),
            "sqlite3.connect": self._sqlite,
            "os.listdir": self._list,
            "os.scandir": self._list,
            # Reads are judged from the path string; a working directory inside .git/ would let a
            # bare relative name through, so entering one is refused too.
            "os.chdir": self._list,
        }

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        # Called for every audit event in the process: return as early as possible. The commonest
        # event by far is a read of an ordinary file: decided here, from the string, in one call.
        if event == "open":
            raw, mode, _ = args
            if (mode == "r" or mode == "rb") and type(raw) is str:
                lowered = raw.lower()
                if ".env" not in lowered and ".git" not in lowered and ".ivralo" not in lowered:
                    if self._stores is None or self._stores.search(lowered) is None:
                        return
        handler = self._handlers.get(event)
        if handler is not None and not getattr(_own, "busy", False):
            handler(args)

    def _started(self, executable: Any, args: Any, cwd: Any) -> None:
        """The program's name: ``sh`` for ``os.system`` and shell commands, else the argv's first. A
        ``git init`` of the workspace folder is refused here, with its sentence."""
        if not self.starting:
            try:
                here = os.path.realpath(os.fsdecode(cwd)) if cwd is not None else os.getcwd()
            except (OSError, TypeError):
                here = self.policy.workspace
            self._refuse(decide_start(args, here, self.policy))
        if isinstance(args, (str, bytes)):
            first = "sh" if executable is None else os.fsdecode(executable)
        elif isinstance(args, (list, tuple)) and args:
            first = os.fsdecode(executable if executable is not None else args[0])
        else:
            first = os.fsdecode(executable) if executable is not None else "?"
        if len(self.started) < 100:
            self.started.append(os.path.basename(first))

    def take_started(self) -> list[str]:
        started, self.started = self.started, []
        return started

    def _refuse(self, refusal: GuardRefusal | None) -> None:
        if refusal is not None:
            self.refusals += 1
            raise refusal

    def _change(self, operation: str, path: str | None, keep: bool = False) -> None:
        if path is None:
            return
        self._refuse(decide_write(operation, path, self.policy, self.starting))
        if keep and path.startswith(self.policy.workspace + os.sep):
            self._keep(path, operation)

    def _keep(self, path: str, operation: str) -> None:
        _own.busy = True
        try:
            self.history.save(path, operation)
        finally:
            _own.busy = False

    def _open(self, args: tuple[Any, ...]) -> None:
        raw, mode, flags = args
        # The hot path: most opens are reads of ordinary files. Decide those from the string alone,
        # before any decoding, syscall or normalisation (reads must cost <= 1.2x of no guard).
        if mode == "r" or mode == "rb" or (mode is None and not flags & _WRITE_FLAGS):
            if type(raw) is str:
                lowered = raw.lower()
                if ".env" not in lowered and ".git" not in lowered and ".ivralo" not in lowered:
                    if self._stores is None or self._stores.search(lowered) is None:
                        return
            path = _path(raw)
            if path is not None:
                self._refuse(decide_read("open", os.path.abspath(path), self.policy.closed_reads))
            return
        path = _path(raw)
        if path is None:
            return
        if mode is not None:
            writes = "w" in mode or "a" in mode or "x" in mode or "+" in mode
            destroys = "w" in mode or ("+" in mode and "a" not in mode and "x" not in mode)
        else:
            writes = bool(flags & _WRITE_FLAGS)
            destroys = bool(flags & os.O_TRUNC) or (writes and not flags & (os.O_APPEND | os.O_EXCL))
        if not writes:
            self._refuse(decide_read("open", os.path.abspath(path), self.policy.closed_reads))
            return
        self._change("open for writing", resolve(path), keep=destroys)

    def _rename(self, args: tuple[Any, ...]) -> None:
        src, dst = _resolve_at(args[0], args[2], False), _resolve_at(args[1], args[3], False)
        self._change("move", src)
        self._change("move onto", dst, keep=True)

    def _symlink(self, args: tuple[Any, ...]) -> None:
        target = _path(args[0])
        if target is not None:  # a link is a way to read a closed file under another name
            self._refuse(decide_read("link to", resolve(target), self.policy.closed_reads))
        self._change("create the link", _resolve_at(args[1], args[2], False))

    def _link(self, args: tuple[Any, ...]) -> None:
        # A hard link to a file outside the workspace would let it be changed from inside.
        self._change("hard-link from", _resolve_at(args[0], args[2], False))
        self._change("create the hard link", _resolve_at(args[1], args[3], False))

    def _sqlite(self, args: tuple[Any, ...]) -> None:
        database = _path(args[0]) if args else None
        if not database or database == ":memory:":
            return
        if database.startswith("file:"):
            location, _, query = database[5:].partition("?")
            if "mode=memory" in query or not location:
                return
            if "mode=ro" in query:
                self._refuse(decide_read("open the database", resolve(location), self.policy.closed_reads))
                return
            database = location
        self._change("open the database", resolve(database))

    def _list(self, args: tuple[Any, ...]) -> None:
        path = _path(args[0]) if args else None
        self._refuse(decide_read("list", os.path.abspath(path if path is not None else "."), self.policy.closed_reads))


class TrustGate:
    """In a folder not trusted, the folder's own modules are not imported (two finders ask it)."""

    def __init__(self, workspace: str, installed: set[str]) -> None:
        self.workspace = workspace
        # What was on sys.path when the kernel started is installed code (stdlib, site-packages,
        # .pth entries), even when a virtualenv lives inside the workspace.
        self.installed = installed

    def inside(self, entry: Any) -> bool:
        """A sys.path entry that is workspace code (not installed code that happens to live there)."""
        if not isinstance(entry, str) or not entry:
            return False
        path = os.path.realpath(entry)
        if not (path == self.workspace or path.startswith(self.workspace + os.sep)):
            return False
        return not any(path == root or path.startswith(root + os.sep) for root in self.installed)

    def refuse_if_found(self, fullname: str, entries: list[str]) -> None:
        if not entries or fullname.split(".")[0] == OWN_PACKAGE:  # ivralo's own stay importable
            return
        if importlib.machinery.PathFinder.find_spec(fullname, entries) is not None:
            raise TrustGateError(
                f"{fullname!r} lives in {self.workspace}, a folder that is not trusted, so the trust gate does "
                f"not import its own code (an import picks a file up by its name alone; a file run on purpose "
                f"by its path, as %run does, is not gated, but its own imports of the folder's modules are). "
                f"To import it, trust the folder: ivralo-kernel trust {self.workspace}. {audience.TELL_THE_PERSON}",
                name=fullname,
            )


class _FrontDoor(importlib.abc.MetaPathFinder):
    """Before the path finder: a workspace folder put back on ``sys.path`` does not open the gate."""

    def __init__(self, gate: TrustGate) -> None:
        self.gate = gate

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        search = path if path is not None else sys.path
        self.gate.refuse_if_found(fullname, [p for p in search if self.gate.inside(p)])
        return None


class _LastResort(importlib.abc.MetaPathFinder):
    """After every other finder failed: if the module is a file of the workspace itself, say why."""

    def __init__(self, gate: TrustGate) -> None:
        self.gate = gate

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if path is None:
            self.gate.refuse_if_found(fullname, [self.gate.workspace])
        return None


def install_file_guard(policy: FsPolicy, history: History) -> FileGuard:
    guard = FileGuard(policy, history)
    sys.addaudithook(guard)
    return guard


def close_the_trust_gate(workspace: str) -> TrustGate:
    """Take the working directory off ``sys.path`` and refuse to import the workspace's modules, with
    a reason. (Entries that ``.pth`` files added are installed packages and stay.)"""
    sys.path[:] = [p for p in sys.path if p not in ("", ".")]
    gate = TrustGate(workspace, {os.path.realpath(p) for p in sys.path if isinstance(p, str)})
    sys.meta_path.insert(0, _FrontDoor(gate))
    sys.meta_path.append(_LastResort(gate))
    return gate
