"""[host] The host's record of the workspace's history: which kept copies a restore may put back.

The write guard runs in the kernel, so ``.ivralo/history/`` (its copies and ``index.jsonl``) is
written by code the host does not trust: a cell (or ``sh``, or ctypes) can add a copy and a line
saying it is ``.vscode/settings.json`` as it was, or rewrite an old copy. So a restore never goes by
that index alone. It goes by this ledger, which lives in the host's config home, where code in the
kernel can neither write nor read (absent in the sandbox; outside Landlock's write floor without
it), one file per workspace.

**What is recorded** (``HistoryRecorder``, run by the host that started the kernel, at the end of
each execution and when the kernel ends): each line the index gained while that kernel ran, once

* its path is a file of the workspace (absolute, normalized, no ``..``) and not a closed one
  (``closed_reason``: ``.git``, ``.ivralo``, ``databases.json``, the tool files, ``.env`` files:
  the write guard never keeps those, so such a line is not its own), and
* its copy is a plain file of the folder (not a link, one link), taken while that kernel ran;

with the SHA-256 of the copy as it was then. Copies and lines already in the folder when the kernel
started (a cloned repository's ``.ivralo/history``, a line planted before) are never recorded.

**What a restore checks** (``history_store.HistoryStore``): the copy is in the ledger, its bytes
still have the recorded hash (an old copy rewritten by a later kernel is refused), and its path is
still not a closed one under today's settings.

What this cannot tell: a copy a cell forges while it runs, of a file of the workspace it could write
itself anyway, is recorded like the guard's own (both are the kernel's writes). docs/security.md says so.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import stat
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from ivralo_kernel.host.sandbox.plan import CLOSED_SEED
from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.credentials import config_home
from ivralo_kernel.protocol.history_index import INDEX, Entry, is_plain_name, parse_line
from ivralo_kernel.protocol.sandbox.closed_names import TOOL_FILES_DEFAULT

LEDGER_DIR = "history"  # under the config home
COMPACT_AFTER_LINES = 4000  # the ledger is rewritten (only copies still there) past this many lines
START_SLACK_NS = 5 * 1_000_000_000  # a copy's time may precede the recorder's start by this much (clocks)
# The write guard's index stays near 2 x history_cap_count lines of ~300 bytes; one the kernel's side
# blew up is not read at all (the host's memory is not the kernel's to spend), nor more new lines per pass.
MAX_INDEX_BYTES = 64 << 20
MAX_NEW_PER_PASS = 10_000
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Recorded:
    """A copy as the host recorded it: its entry (as the index said) and its bytes' SHA-256."""

    entry: Entry
    sha256: str


def home_inside(workspace: str) -> str | None:
    """The person's home folder relative to ``workspace`` when the workspace holds it ("" when it is
    the home folder: JupyterLab started there), else None."""
    home = os.path.realpath(os.path.expanduser("~"))
    workspace = os.path.realpath(workspace)
    if home == workspace:
        return ""
    return os.path.relpath(home, workspace) if home.startswith(workspace.rstrip(os.sep) + os.sep) else None


def closed_reason(rel: str, tool_files: Iterable[str] = TOOL_FILES_DEFAULT, home: str | None = None) -> str | None:
    """Why a file of the workspace (``rel``, relative) is one no restore writes, or None. The paths
    the sandbox keeps read-only (host/sandbox/plan.py's CLOSED_SEED and tool files), at any depth (a
    subfolder opened on its own in an editor runs its own ``.vscode``; a repository in a subfolder
    has its own ``.git``), compared without case (a case-insensitive file system takes ``.GIT`` for
    ``.git``), and ``.env`` files, which the write guard never copies."""
    parts = rel.split(os.sep)
    folded = [p.casefold() for p in parts]
    if any(p in ("", ".", "..") for p in parts):
        return f"{rel} is not a plain path inside the workspace"
    for closed in (*CLOSED_SEED, *tool_files):
        want = [p.casefold() for p in closed.strip(os.sep).split(os.sep) if p]
        if not want:
            continue
        if any(folded[i : i + len(want)] == want for i in range(len(folded))):
            return f"{rel} is under {closed}, which code in the kernel may not write"
    if home is not None:  # the sandbox keeps every dot-entry of the home folder closed, existing or not
        under = parts[len(home.split(os.sep)) :] if home else parts
        if (not home or parts[: len(home.split(os.sep))] == home.split(os.sep)) and under and under[0].startswith("."):
            return f"{rel} is under the home folder's {under[0]}, which code in the kernel may not write"
    name = folded[-1]
    if name == names.DOTENV_FILE or name.startswith(".env."):
        return f"{rel} is a .env file, which code in the kernel may not write"
    return None


def inside_path(workspace: str, path: str) -> str | None:
    """``path`` relative to ``workspace``, when it is an absolute, normalized path inside it; else None."""
    if not os.path.isabs(path) or os.path.normpath(path) != path or not path.startswith(workspace + os.sep):
        return None
    rel = os.path.relpath(path, workspace)
    return None if rel.startswith("..") else rel


class HistoryLedger:
    """The ledger of one workspace: ``<config home>/history/<hash of the workspace>.jsonl``."""

    def __init__(self, workspace: str, env: Mapping[str, str] | None = None) -> None:
        self.workspace = os.path.realpath(workspace)
        key = hashlib.blake2s(self.workspace.encode("utf-8", "surrogateescape"), digest_size=10).hexdigest()
        name = os.path.basename(self.workspace) or "root"
        self.path = os.path.join(config_home(os.environ if env is None else env), LEDGER_DIR, f"{name}-{key}.jsonl")

    def recorded(self) -> dict[str, Recorded]:
        """Every copy recorded, by its file name in the folder."""
        found: dict[str, Recorded] = {}
        try:
            with open(self.path, "rb") as ledger:
                lines = ledger.read().decode("utf-8", "replace").splitlines()
        except FileNotFoundError:
            return found
        for line in lines:
            entry = parse_line(line)
            try:
                raw = json.loads(line)
            except ValueError:
                continue
            digest = raw.get("sha256") if isinstance(raw, dict) else None
            if entry is not None and isinstance(digest, str) and raw.get("workspace") == self.workspace:
                found[entry.copy] = Recorded(entry, digest)
        return found

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The ledger to ourselves: a lock file beside it, as a compaction replaces the ledger's own
        inode (an append waiting on the old one's lock would write into a file no longer there)."""
        os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
        fd = os.open(f"{self.path}.lock", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # another host of this workspace records too
            yield
        finally:
            os.close(fd)

    def add(self, records: Iterable[Recorded]) -> None:
        with self._locked():
            self._append(self.path, records)

    def _append(self, path: str, records: Iterable[Recorded]) -> None:
        lines = []
        for record in records:
            fields = json.loads(record.entry.line())
            fields.update(sha256=record.sha256, workspace=self.workspace)
            lines.append(json.dumps(fields) + "\n")
        if not lines:
            return
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            data = "".join(lines).encode("utf-8", "surrogateescape")
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                # A host killed in the middle of its append left a torn last line: ours starts on a
                # line of its own, so the torn one is the only record lost (and it was never complete).
                data = b"\n" + data
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)

    def compact(self, keep: set[str]) -> None:
        """Only the records of copies still there (a temporary file, then an atomic replace), under
        the lock: a record another host adds meanwhile is never dropped by the replace."""
        with self._locked():
            records = [r for name, r in self.recorded().items() if name in keep]
            fresh = f"{self.path}.{os.getpid()}.new"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(fresh)
            self._append(fresh, records)
            if os.path.exists(fresh):
                os.replace(fresh, self.path)

    def line_count(self) -> int:
        try:
            with open(self.path, "rb") as ledger:
                return sum(1 for _ in ledger)
        except FileNotFoundError:
            return 0


def read_index(directory: str, problems: list[str] | None = None) -> list[Entry]:
    """The entries of the folder's index (written from the kernel's side): none when it is not a
    plain file or is larger than ``MAX_INDEX_BYTES``."""
    try:
        fd = os.open(os.path.join(directory, INDEX), _READ)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as index:
        st = os.fstat(index.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_INDEX_BYTES:
            if problems is not None:
                problems.append(
                    f"{INDEX}: not a plain file, or {st.st_size} bytes (more than {MAX_INDEX_BYTES}): not read"
                )
            return []
        lines = index.read(MAX_INDEX_BYTES).decode("utf-8", "replace").splitlines()
    return [e for e in map(parse_line, lines) if e is not None]


def copy_digest(directory_fd: int, copy: str) -> tuple[str, int] | None:
    """(SHA-256, size) of a copy that is a plain file of the folder (no link, one link); else None."""
    try:
        fd = os.open(copy, _READ, dir_fd=directory_fd)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            return None
        return hashlib.file_digest(f, "sha256").hexdigest(), st.st_size


class HistoryRecorder:
    """Records the copies one kernel's write guard adds to the workspace's history, from the host.

    Made before the kernel starts (what is in the folder then is never recorded); ``record()`` is
    called when an execution ends (``poke()``: on a thread of its own, as hashing a large copy must
    not hold the watchdog) and when the kernel ends (``close()``)."""

    def __init__(
        self, workspace: str, tool_files: Iterable[str] = TOOL_FILES_DEFAULT, env: Mapping[str, str] | None = None
    ) -> None:
        self.ledger = HistoryLedger(workspace, env)
        self.workspace = self.ledger.workspace
        self.directory = os.path.join(self.workspace, names.HISTORY_DIR)
        self.tool_files = tuple(tool_files)
        self.started_ns = time.time_ns()
        self.refused: list[str] = []  # why lines were not recorded (for the log and the tests)
        self._lock = threading.Lock()
        self._index_seen: tuple[int, int, int] | None = None
        self._before = self._present()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def _present(self) -> set[str]:
        """The copies and lines already there: never this kernel's."""
        found: set[str] = set()
        with contextlib.suppress(OSError):
            found.update(entry.name for entry in os.scandir(self.directory))
        for entry in self._index_entries():
            found.add(entry.copy)
        return found

    def _index_entries(self) -> list[Entry]:
        return read_index(self.directory, self.refused)

    def changed(self) -> bool:
        """The index changed since the last pass, or a pass is under way (a stat: cheap enough for the
        end of every cell). A pass on the watchdog's thread marks the index seen before it has written
        the ledger: a caller that skipped it then could list the history before its copies were in."""
        if self._lock.locked():
            return True
        try:
            st = os.stat(os.path.join(self.directory, INDEX), follow_symlinks=False)
        except OSError:
            return False
        return (st.st_ino, st.st_size, st.st_mtime_ns) != self._index_seen

    def record(self) -> int:
        """Record what the index gained since the last time: the number of copies recorded."""
        with self._lock:
            try:
                st = os.stat(os.path.join(self.directory, INDEX), follow_symlinks=False)
            except OSError:
                return 0
            seen = (st.st_ino, st.st_size, st.st_mtime_ns)
            if seen == self._index_seen:
                return 0
            self._index_seen = seen
            known = self.ledger.recorded()
            fresh: list[Recorded] = []
            try:
                folder = os.open(self.directory, _DIR)
            except OSError:
                return 0
            try:
                for entry in self._index_entries():
                    if entry.copy in known or entry.copy in self._before:
                        continue
                    if len(fresh) >= MAX_NEW_PER_PASS:
                        self.refused.append(f"more than {MAX_NEW_PER_PASS} new lines at once: the rest not recorded")
                        break
                    self._before.add(entry.copy)  # judged once, whatever the verdict
                    why = self._refusal(entry)
                    digest = None if why else copy_digest(folder, entry.copy)
                    if why is None and digest is None:
                        why = "its copy is not a plain file of the history (a link, a hard link, or gone)"
                    if why is not None or digest is None:
                        self.refused.append(f"{entry.copy}: {why}")
                        continue
                    fresh.append(
                        Recorded(
                            Entry(
                                entry.time, entry.ns, entry.path, entry.operation, digest[1], entry.copy, entry.restored
                            ),
                            digest[0],
                        )
                    )
            finally:
                os.close(folder)
            self.ledger.add(fresh)
            if self.ledger.line_count() > COMPACT_AFTER_LINES:
                with contextlib.suppress(OSError):
                    self.ledger.compact(set(os.listdir(self.directory)))
            return len(fresh)

    def _refusal(self, entry: Entry) -> str | None:
        if not is_plain_name(entry.copy):
            return "its copy's name is not a file of the folder"
        rel = inside_path(self.workspace, entry.path)
        if rel is None:
            return f"{entry.path} is not a file inside the workspace"
        why = closed_reason(rel, self.tool_files, home_inside(self.workspace))
        if why is not None:
            return why + ": the write guard never keeps such a copy"
        if entry.ns < self.started_ns - START_SLACK_NS:
            return "it says it was taken before this kernel started"
        return None

    # On a thread of its own ---------------------------------------------------------------------------
    def poke(self) -> None:
        """An execution ended: record soon, off the caller's thread."""
        if self._closed:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ivralo-history-recorder", daemon=True)
            self._thread.start()
        self._wake.set()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait()
            self._wake.clear()
            if self._closed:
                return
            with contextlib.suppress(OSError):
                self.record()

    def close(self) -> None:
        """The kernel ended: one last pass (a copy written after its last execution), then stop."""
        if self._closed:
            return
        with contextlib.suppress(OSError):
            self.record()
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
