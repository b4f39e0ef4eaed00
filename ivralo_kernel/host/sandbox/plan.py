"""[host] The OS sandbox each kernel lives in, built by bubblewrap.

One ``bwrap`` per kernel, with every namespace (user, mount, pid, ipc, uts, net, cgroup). The mount
table is the write policy:

* the root file system read-only; the workspace read-write;
* closed paths read-only over it, whether they exist at start or not (a placeholder for each missing
  one, made by the host first: ``closed_paths``): ``.git`` (and the git folder a ``.git`` file points
  to, with its common folder), ``.ivralo`` (but for the kernel's history folder and the worker log),
  ``databases.json``, the configurable tool files that other programs run by themselves, the home
  folder's dot-entries when the workspace holds it, and the host's interpreter where it lives inside;
* each ``.env`` in the workspace covered by a private empty file;
* ``/tmp``, ``/dev/shm``, ``/run``, ``$XDG_RUNTIME_DIR`` and Jupyter's runtime folder empty, so no unix
  socket of the machine can be reached (a read-only mount does not stop ``connect()``); the kernel's
  own runtime folder (its ipc sockets, the egress proxy's socket), its exchange folder (the namespace
  API's shared memory) and its connection and policy files are bound back, alone;
* ivralo's config home and the usual credential stores absent;
* a minimal ``/dev`` with a pty, and a ``/proc`` that shows only the sandbox's processes;
* IPython's folder as it is, with the kernel's writes in a layer of their own that ends with it
  (an overlay; where bwrap has none, a tmpfs with the person's files bound read-only in it).

When the sandbox's first process ends, the Linux kernel ends every process in it; the supervisor
ends when the host process does (a pipe only the host writes to reaches EOF).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import ivralo_kernel.host.sandbox.limits as sandbox_limits
from ivralo_kernel.host.sandbox.bwrap import OptionalOption, lacked_options
from ivralo_kernel.host.sandbox.closed_paths import TOOL_FILES_DEFAULT, Placeholder, placeholder_for
from ivralo_kernel.protocol import database_env_names, names, scrub
from ivralo_kernel.protocol.credentials import ScrubRule, config_home, credential_store_paths, home_config_inside

DATABASES_FILE = "databases.json"
CLOSED_SEED = (".git", names.STATE_DIR, DATABASES_FILE)
HISTORY_DIR = names.HISTORY_DIR
ENV_SCAN_MAX_DIRS = 5000  # .env files are looked for this far; a larger tree is cut short (logged)
ENV_SCAN_SKIP = frozenset({".git", "node_modules", ".venv", "venv", "__pycache__", ".tox", ".mypy_cache"})
# Without an overlay, each entry of IPython's folder is a mount of its own: a profile with more is
# bound read-only as a whole rather than rebuilt entry by entry.
PRIVATE_LAYER_MAX_ENTRIES = 64


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _entries(folder: str) -> list[str]:
    try:
        return sorted(os.path.join(folder, name) for name in os.listdir(folder))
    except OSError:
        return []


def git_folders(workspace: str) -> list[str]:
    """The folders git runs hooks and reads config from for this workspace: ``.git``, or where a
    ``.git`` file points (linked worktrees, submodules), with its common folder."""
    dot_git = os.path.join(workspace, ".git")
    if os.path.isdir(dot_git):
        return [dot_git]
    if not os.path.isfile(dot_git):
        return []
    found = [dot_git]
    try:
        line = Path(dot_git).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return found
    if not line.startswith("gitdir:"):
        return found
    gitdir = os.path.realpath(os.path.join(workspace, line.removeprefix("gitdir:").strip()))
    if os.path.isdir(gitdir):
        found.append(gitdir)
        commondir = os.path.join(gitdir, "commondir")
        if os.path.isfile(commondir):
            try:
                common = Path(commondir).read_text(encoding="utf-8", errors="replace").strip()
            except OSError:
                common = ""
            common_path = os.path.realpath(os.path.join(gitdir, common)) if common else ""
            if common_path and os.path.isdir(common_path):
                found += [os.path.join(common_path, "hooks"), os.path.join(common_path, "config")]
    return [p for p in found if os.path.exists(p)]


def env_files(workspace: str) -> list[str]:
    """The ``.env`` files under the workspace that the sandbox could reach (each is masked inside)."""
    found: list[str] = []
    seen = 0
    for folder, dirs, files in os.walk(workspace):
        seen += 1
        if seen > ENV_SCAN_MAX_DIRS:
            break
        dirs[:] = [d for d in dirs if d not in ENV_SCAN_SKIP and sandbox_can_enter(os.path.join(folder, d))]
        if names.DOTENV_FILE in files:
            found.append(os.path.join(folder, names.DOTENV_FILE))
    return found


def sandbox_can_enter(folder: str) -> bool:
    """Whether the sandboxed kernel can go into ``folder``, where the host can.

    They differ only for root. bwrap maps root to root in a user namespace of its own, whose
    capabilities cover only files owned by a mapped id: another user's private folder (``/tmp``'s
    ``pytest-of-nobody``, a home folder with mode 0700) is closed to it. A ``.env`` in there needs
    no mask, and a mask would fail the start: bwrap cannot make the mount point ("Can't mkdir
    parents ...: Permission denied"). Everyone else's sandbox has the host's own access."""
    if os.geteuid() != 0:
        return True
    try:
        st = os.stat(folder)
    except OSError:
        return False
    if st.st_uid == 0 or st.st_mode & stat.S_IXOTH:
        return True
    return bool(st.st_mode & stat.S_IXGRP) and st.st_gid in {0, *os.getgroups()}


@dataclass
class SandboxPlan:
    bwrap: str
    workspace: str
    run_dir: str  # this kernel's own runtime folder: read-write inside (ipc sockets, egress socket)
    empty_file: str  # what each .env shows inside
    read_only_files: tuple[str, ...] = ()  # the connection file, the policy file
    tool_files: tuple[str, ...] = TOOL_FILES_DEFAULT
    # The optional options this bwrap lacks, each replaced as it says; None: ask it (``lacked_options``).
    lacks: tuple[OptionalOption, ...] | None = None
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    home: str = field(default_factory=lambda: os.path.expanduser("~"))
    jupyter_runtime_dir: str | None = None
    # Folders the kernel's own tools write to by habit (IPython's profile): seen as they are, with
    # writes kept in a private layer that ends with the sandbox.
    scratch_overlays: tuple[str, ...] = ()
    # The interpreter and the code the kernel runs: seen read-only even where they live in a folder
    # the sandbox empties (a virtualenv or a checkout under /tmp).
    code_trees: tuple[str, ...] = ()
    # The host's own interpreter, its packages and ivralo's code: read-only inside even in the workspace
    # (a uv project whose .venv runs JupyterLab), since what the kernel wrote there would run in the host.
    # A project's own .venv that only the kernel runs is not among them: %pip install writes there.
    host_trees: tuple[str, ...] = ()
    # The person's credential stores, absolute (see protocol.credentials.CREDENTIAL_STORES).
    credential_store_paths: tuple[str, ...] = ()
    # The kernel's exchange folder for the namespace API's data plane (on tmpfs, usually in /dev/shm):
    # bound back alone, at the same path, over the emptied /dev/shm.
    exchange_dir: str = ""
    # The size of each scratch tmpfs (/tmp, /var/tmp, /dev/shm); see host/sandbox/limits.py.
    scratch_bytes: int = field(default_factory=lambda: sandbox_limits.scratch_bytes(None))
    # What the supervisor lowers for the sandbox's namespaces (inotify, System V IPC): with it, bwrap
    # gives the supervisor CAP_SYS_RESOURCE, which it drops before the kernel starts.
    namespace_limits: str = ""
    sized_tmpfs: bool = False  # this bwrap has --size (host/sandbox_limits.bwrap_sizes_tmpfs)
    # A descriptor bwrap reads the seccomp filter from (passed to it by the launch), or None.
    seccomp_fd: int | None = None
    # Device nodes (GPUs) passed through into the minimal /dev (protocol/sandbox/devices.py).
    devices: tuple[str, ...] = ()

    def hidden(self) -> list[str]:
        """Existing folders whose content the sandbox must not see (empty inside), wherever they
        are: inside the workspace too (JupyterLab started in the home folder)."""
        candidates = ["/tmp", "/run", "/var/run", "/var/tmp", "/dev/shm"]  # noqa: S108 - hidden, not used
        candidates += [self.env.get("XDG_RUNTIME_DIR", ""), self.jupyter_runtime_dir or ""]
        candidates += [str(config_home(self.env))]
        out: list[str] = []
        for path in candidates:
            if not path or not os.path.isdir(path) or os.path.islink(path):
                continue
            real = os.path.realpath(path)
            if real not in out and real != self.workspace:
                out.append(real)
        return out

    def credential_stores(self) -> list[str]:
        """The person's credential stores, inside the workspace too (unless the workspace is in one)."""
        found = []
        for path in self.credential_store_paths or credential_store_paths({"HOME": self.home}):
            real = os.path.realpath(path)
            if os.path.exists(path) and not _inside(self.workspace, real):
                found.append(real)
        return found

    def _empty(self, path: str) -> list[str]:
        if not os.path.isdir(path):
            return ["--ro-bind", self.empty_file, path]
        # A file on a tmpfs is memory no RSS shows: each mount gets a size (bwrap >= 0.7.0).
        size = sandbox_limits.tmpfs_bytes(path, self.scratch_bytes)
        return (["--size", str(size)] if self.sized_tmpfs else []) + ["--tmpfs", path]

    def _closed_names(self) -> list[str]:
        names_here = [*CLOSED_SEED, *self.tool_files]
        if self._in_a_repository():
            # git's discovery takes a folder with HEAD, objects/ and refs/ for a bare repository before it
            # looks further up: a HEAD that is a folder is no head, so the person's repository stays theirs.
            names_here.append("HEAD")
        return [os.path.join(self.workspace, name) for name in names_here]

    def _in_a_repository(self) -> bool:
        """Whether a folder above the workspace has a ``.git``: the person's git in the workspace is
        that repository's, and a repository made in the workspace folder itself would take its place."""
        folder = os.path.dirname(self.workspace)
        while True:
            if os.path.lexists(os.path.join(folder, ".git")):
                return True
            parent = os.path.dirname(folder)
            if parent == folder:
                return False
            folder = parent

    def _home(self) -> str | None:
        """The home folder when the workspace holds it (JupyterLab started there)."""
        home = os.path.realpath(self.home)
        return home if _inside(home, self.workspace) else None

    def home_open_entries(self) -> list[str]:
        """With the workspace holding the home folder, whose top level is read-only inside: the
        entries bound writable over it, each existing non-dot folder and file (not a link, which
        would bind where it points; not a socket or a device)."""
        home = self._home()
        if home is None:
            return []
        try:
            entries = sorted(os.scandir(home), key=lambda e: e.name)
        except OSError:
            return []
        return [
            e.path
            for e in entries
            if not e.name.startswith(".")
            and not e.is_symlink()
            and (e.is_dir(follow_symlinks=False) or e.is_file(follow_symlinks=False))
        ]

    def missing(self) -> list[Placeholder]:
        """What must exist before the sandbox is built for every closed path to be closed: a
        placeholder for each one that is missing (or whose link points to nothing yet, inside). None
        at the top of a home folder the workspace holds: that level is read-only inside, so nothing
        missing there can be made (``home_open_entries``), and the person's home gets no placeholders."""
        wanted: list[tuple[str, str, str]] = []
        home = self._home()
        for path in self._closed_names():
            target = os.path.realpath(path) if os.path.islink(path) else path
            if _inside(target, self.workspace) and target != self.workspace:
                # databases.json is the person's to write while a kernel runs (JupyterLab's editor, a
                # script): an empty file they can fill in place, not a folder in the way (it shows in
                # `git status` meanwhile). The host reads an empty one as none.
                kind = "file" if os.path.basename(target) == DATABASES_FILE else "dir"
                wanted.append((target, kind, ""))
        found: dict[str, Placeholder] = {}
        for path, kind, content in wanted:
            placeholder = placeholder_for(path, kind, content)
            if placeholder is not None and home is not None and os.path.dirname(placeholder.path) == home:
                continue
            if placeholder is not None and placeholder.path not in found:
                found[placeholder.path] = placeholder
        return list(found.values())

    def closed_links(self) -> dict[str, str]:
        """The closed names that are symlinks, with where each points (the home folder's dot-entries
        too, when the workspace holds it): closed at their target, the link itself is not."""
        paths = self._closed_names()
        home = self._home()
        if home is not None:
            try:
                paths += [e.path for e in os.scandir(home) if e.name.startswith(".") and e.is_symlink()]
            except OSError:
                pass
        links: dict[str, str] = {}
        for path in paths:
            try:
                links[path] = os.readlink(path)
            except OSError:  # not a link
                continue
        return links

    def closed(self) -> list[str]:
        """Paths inside the workspace (and git folders it points to) that stay read-only: the closed
        names (at their target, for a link), the person's own configuration when the workspace holds
        it, and the host's interpreter and packages when they live in the workspace (a project's
        ``.venv``). The placeholders of ``missing()`` are made by then, so they are here too."""
        out = git_folders(self.workspace)
        for path in self._closed_names()[1:]:
            if os.path.islink(path):  # a mount follows the link: closed where it points
                path = os.path.realpath(path)
            if os.path.exists(path) and _inside(path, self.workspace) and path != self.workspace and path not in out:
                out.append(path)
        ipython = {os.path.realpath(p) for p in self.scratch_overlays}  # its own private layer
        for path in home_config_inside(self.workspace, {**self.env, "HOME": self.home}):
            if path not in out and path not in ipython and not os.path.islink(path):
                out.append(path)
        for path in dict.fromkeys(os.path.realpath(p) for p in self.host_trees if os.path.isdir(p)):
            if path != self.workspace and _inside(path, self.workspace) and path not in out:
                out.append(path)
        return out

    def offers(self, flag: str) -> bool:
        """Whether this plan's bwrap has ``flag`` (a required one, or an optional one it does not lack)."""
        lacks = lacked_options(self.bwrap) if self.lacks is None else self.lacks
        return not any(flag in option.flags for option in lacks)

    def private_layer(self, folder: str) -> list[str]:
        """``folder`` as it is, with the kernel's writes kept apart and gone with the sandbox: an
        overlay whose upper layer is a tmpfs; without one (bwrap < 0.11), a tmpfs with each of the
        folder's entries bound read-only in it, two levels deep (IPython's profiles), so new files
        go to the tmpfs and the person's own (startup scripts, config) cannot be changed."""
        if self.offers("--tmp-overlay"):
            return ["--overlay-src", folder, "--tmp-overlay", folder]
        a = self._empty(folder)
        for entry in _entries(folder):
            inner = _entries(entry) if os.path.isdir(entry) and not os.path.islink(entry) else None
            if inner is None or len(inner) > PRIVATE_LAYER_MAX_ENTRIES:
                a += ["--ro-bind-try", entry, entry]  # a file, or a folder too large to rebuild: read-only
                continue
            a += self._empty(entry)
            for path in inner:
                a += ["--ro-bind-try", path, path]
        return a

    def argv(self, command: Iterable[str]) -> list[str]:
        # Not --die-with-parent: Linux sends that signal when the launching *thread* exits, and
        # jupyter_client may launch from a thread that ends (the host's life pipe says it instead).
        # --as-pid-1: the supervisor is the sandbox's init, so when it ends (even by SIGKILL) the Linux
        # kernel ends every process in the sandbox; bwrap's own init would wait for the last one.
        # Mounts are made in order, a later one over an earlier one: first what is emptied outside the
        # workspace, then the workspace, then what is closed or emptied inside it, then the few
        # paths that must show through all of that (the kernel's own files).
        a = [self.bwrap, "--unshare-all", "--as-pid-1", "--ro-bind", "/", "/"]
        # A session of its own: no terminal to push keystrokes into (TIOCSTI) from inside.
        a += ["--new-session"]
        if self.seccomp_fd is not None:  # loaded after the sandbox is built, before the supervisor runs
            a += ["--seccomp", str(self.seccomp_fd)]
        a += ["--dev", "/dev", "--proc", "/proc"]
        for path in self.devices:  # --dev-bind: a device node works there (--bind would mount it nodev)
            if os.path.exists(path):
                a += ["--dev-bind", path, path]
        # No capability inside, for root's sandbox too (everybody else's bwrap keeps none): with
        # CAP_SYS_ADMIN in its user namespace a process could unmount a read-only mount (.git) and
        # write what it covered. Then only what the supervisor needs, which it drops itself.
        a += ["--cap-drop", "ALL"]
        if self.namespace_limits:
            # The supervisor's, for its namespace limits alone; CAP_SETPCAP to drop it from the bounding set.
            a += ["--cap-add", "CAP_SYS_RESOURCE", "--cap-add", "CAP_SETPCAP"]
        # The person's keys are listed there by name (the filter refuses keyctl, so not by content).
        a += ["--ro-bind", self.empty_file, "/proc/keys", "--ro-bind", self.empty_file, "/proc/key-users"]
        hidden, stores = self.hidden(), self.credential_stores()
        for path in [*hidden, *stores]:
            if not _inside(path, self.workspace):
                a += self._empty(path)
        for path in dict.fromkeys(os.path.realpath(p) for p in self.code_trees if os.path.isdir(p)):
            if any(_inside(path, h) for h in hidden) and not _inside(path, self.workspace):
                a += ["--ro-bind", path, path]
        a += ["--bind", self.workspace, self.workspace]
        home = self._home()
        if home is not None:
            # Every dot-entry of the home folder stays closed, existing or not: its top level is
            # read-only, with each existing non-dot entry writable over it (a new entry there, dotted
            # or not, is refused; work goes on in the subfolders and the files already there).
            a += ["--ro-bind", home, home]
            for path in self.home_open_entries():
                a += ["--bind", path, path]
        for path in self.closed():
            a += ["--ro-bind", path, path]
        for path in [*hidden, *stores]:
            if _inside(path, self.workspace):
                a += self._empty(path)
        for path in self.scratch_overlays:
            if os.path.isdir(path):
                a += self.private_layer(path)
        a += ["--bind", self.run_dir, self.run_dir]
        if self.exchange_dir and os.path.isdir(self.exchange_dir):
            a += ["--bind", self.exchange_dir, self.exchange_dir]
        for path in self.read_only_files:
            a += ["--ro-bind", path, path]
        # The kernel's own files under .ivralo stay writable: its history of overwritten files, and
        # the log the supervisor writes when a start fails.
        for name in (HISTORY_DIR, names.WORKER_LOG):
            path = os.path.join(self.workspace, name)
            if os.path.exists(path):
                a += ["--bind", path, path]
        for path in env_files(self.workspace):
            a += ["--ro-bind", self.empty_file, path]
        # bwrap's /dev is a tmpfs with no size: read-only, so no file can be written there (its device
        # nodes, /dev/pts and /dev/shm are mounts of their own and stay as they are).
        a += ["--remount-ro", "/dev"]
        a += ["--chdir", self.workspace, "--"]
        return a + list(command)


def prepare_workspace(workspace: str) -> None:
    """Make what must exist before the sandbox is built: ``.ivralo`` (read-only inside, so code cannot
    grant itself anything there), with the kernel's history folder and worker log (writable inside)."""
    os.makedirs(os.path.join(workspace, HISTORY_DIR), exist_ok=True)
    log = os.path.join(workspace, names.WORKER_LOG)
    if not os.path.exists(log):
        with open(log, "a", encoding="utf-8"):
            pass


def dotenv_set_aside(workspace: str) -> str | None:
    """Why the workspace's ``.env`` cannot be used, in one line naming the file, the line and what
    to do; None when it can (or there is none). The file is the workspace's, so any bytes may be in
    it: a NUL byte (which no environment can hold) or bytes that are not UTF-8 set the whole file
    aside, and the kernel starts without it, rather than not starting at all."""
    path = os.path.join(workspace, names.DOTENV_FILE)
    try:
        data = Path(path).read_bytes()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    except OSError as exc:
        return f"{path} was set aside: it cannot be read ({exc.strerror or exc}); fix its permissions"
    for number, line in enumerate(data.split(b"\n"), start=1):
        if b"\0" in line:
            why = "holds a NUL byte, which no environment variable can hold"
        else:
            try:
                line.decode("utf-8")
                continue
            except UnicodeDecodeError:
                why = "is not UTF-8 text"
        fix = "remove that line (or save the file as UTF-8) and restart the kernel"
        return f"{path} was set aside: line {number} {why}; {fix}"
    return None


def dotenv_for_kernel(workspace: str, env: Mapping[str, str], use_file: bool = True) -> dict[str, str]:
    """The workspace's ``.env`` as the kernel would have loaded it, read here by the host (inside
    the sandbox the file reads empty): ``${VAR}`` expanded against the kernel's own, already
    scrubbed, environment, never the host's; secrets left out; what ``env`` sets wins."""
    path = os.path.join(workspace, names.DOTENV_FILE)
    if not use_file or not os.path.isfile(path) or dotenv_set_aside(workspace) is not None:
        return {}
    from dotenv.main import DotEnv
    from dotenv.variables import parse_variables

    resolved: dict[str, str] = {}
    for name, value in DotEnv(path, interpolate=False).dict().items():
        if value is None:
            continue
        scope = {**resolved, **env}  # override=False: the environment wins, as in load_dotenv
        resolved[name] = "".join(atom.resolve(scope) for atom in parse_variables(value))
    kept, _removed = dotenv_split(workspace, env, resolved)
    return {name: value for name, value in kept.items() if name not in env}


def dotenv_split(workspace: str, env: Mapping[str, str], values: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """(the ``.env`` values the kernel may have, the names kept from it). The person's rule comes
    from ``env`` (the host's), never from the file: a line in ``.env`` cannot except itself."""
    db_names, _ = database_env_names(workspace, {**env, **values})
    kept, removed = scrub(values, db_names, rule=ScrubRule.load(env))
    kept.pop(names.ENV_SCRUB_RULE, None)
    return kept, removed


def dotenv_kept_out(workspace: str, env: Mapping[str, str]) -> list[str]:
    """The names in the workspace's ``.env`` that never reach the kernel (for doctor: names only)."""
    path = os.path.join(workspace, names.DOTENV_FILE)
    if not os.path.isfile(path) or dotenv_set_aside(workspace) is not None:
        return []
    from dotenv import dotenv_values

    values = {k: v for k, v in dotenv_values(path).items() if v is not None}
    return dotenv_split(workspace, env, values)[1]
