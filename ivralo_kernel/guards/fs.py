"""[guards] File decisions: (operation, path, policy) -> None (allowed) or a ``GuardRefusal``.

Pure functions, no I/O but ``os.path.realpath``. The audit hook (``_hooks``) calls them; tests call
them directly.

* Writes are allowed only inside the workspace (resolved: symlinks, ``..``) and the kernel's own
  private temp folder; a symlink in the workspace that points out is outside. Closed even inside:
  ``.git/`` and ``.ivralo/`` (any case spelling; a ``git init`` of the workspace folder too), ``.env``
  files, ivralo's configuration when the config home is the workspace, the tool files other programs
  run by themselves (``protocol.closed_names``, and in the sandbox its read-only mounts), and every
  dot-entry of the home folder when the workspace holds it, with any new entry at its top. The
  read-only role refuses every write, and so does the hermetic surface (both keep the private temp
  folder, the hermetic surface's scratch).
* Reads are free except ``.env`` files (anywhere), ``.git/`` / ``.ivralo/`` (anywhere, any case) and
  the person's credential stores (``~/.ssh``, ``~/.aws``, ...: the policy's list).
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field

from ivralo_kernel.protocol import GuardRefusal, audience, names

CLOSED_DIRS = (".git", ".ivralo")
CONFIG_FILES = frozenset(
    {"permissions.json", "databases.json", "mcp.json", "schedules.json", "google-token.json", "token.json"}
)
CONFIG_DIRS = frozenset({"skills.local"})
READONLY_AGENT = "this session's Python only reads"
STOP = audience.TELL_THE_PERSON


@dataclass(frozen=True)
class FsPolicy:
    workspace: str  # resolved
    readonly: bool = False
    hermetic: bool = False  # the hermetic surface: writes go to the scratch folder (writable_extra) only
    writable_extra: tuple[str, ...] = ()  # resolved: the kernel's private temp folder, /dev/null
    config_home_is_workspace: bool = False
    allow_during_startup: tuple[str, ...] = ()  # the kernel's own folders while it starts
    history_dir: str = field(default="")
    closed_reads: tuple[str, ...] = ()  # absolute: credential stores
    closed_writes: tuple[str, ...] = ()  # absolute: the person's configuration inside the workspace
    # absolute: what other tools run or read by themselves (protocol.closed_names), existing or not,
    # and in the sandbox every read-only mount inside the workspace (a placeholder, a project's .venv)
    closed_tools: tuple[str, ...] = ()
    home_inside: str = ""  # the home folder, when the workspace holds it: every dot-entry closed
    home_kept_open: tuple[str, ...] = ()  # but IPython's folder, which the kernel writes its history to

    @property
    def state_dir(self) -> str:
        return os.path.join(self.workspace, names.STATE_DIR)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _parts(path: str) -> list[str]:
    return [p.casefold() for p in path.split(os.sep) if p]


def closed_component(path: str) -> str | None:
    """``.git`` or ``.ivralo`` if the path goes through one (any case spelling)."""
    for part in _parts(path):
        if part in CLOSED_DIRS:
            return part
    return None


def resolve(path: str, follow_last: bool = True) -> str:
    """Absolute and resolved. With ``follow_last`` False the last component itself is kept (remove,
    rename and symlink act on a link, not on what it points to)."""
    path = os.path.abspath(path)
    if follow_last:
        return os.path.realpath(path)
    head, tail = os.path.split(path)
    return os.path.join(os.path.realpath(head), tail)


def decide_write(operation: str, path: str, policy: FsPolicy, starting: bool = False) -> GuardRefusal | None:
    """``path`` must already be resolved."""

    def refuse(why: str, instead: str) -> GuardRefusal:
        return GuardRefusal(guard="write guard", operation=operation, target=path, why=why, instead=instead)

    if starting and any(_inside(path, root) for root in policy.allow_during_startup):
        return None
    if any(_inside(path, root) for root in policy.writable_extra):
        return None
    if policy.hermetic:
        scratch = policy.writable_extra[0] if policy.writable_extra else "its scratch folder"
        return refuse(
            f"the hermetic surface writes only to its scratch folder {scratch} (tempfile.gettempdir(), removed "
            "with the kernel)",
            'Write there, or run this on the project surface (the ivralo kernel, or Session(surface="project")).',
        )
    if policy.readonly:
        return refuse(
            audience.for_audience(person="this kernel only reads (its role is readonly)", agent=READONLY_AGENT),
            audience.for_audience(
                person="Change files outside this kernel, or start a kernel whose role may write.",
                agent="Change files with edit_file or write_file, which show the change to the person for approval.",
            ),
        )
    if not _inside(path, policy.workspace):
        return refuse(f"it is outside the workspace {policy.workspace}", f"Write inside the workspace. {STOP}")
    for own in policy.closed_writes:
        if _inside(path, own):
            return refuse(
                f"{own} is the person's own configuration (the workspace holds their home folder or config); "
                "what is written there runs or is trusted later, outside any review",
                STOP,
            )
    relative = os.path.relpath(path, policy.workspace)
    closed = closed_component(relative)
    if closed == ".git" and _parts(relative)[0] == ".git":
        return refuse(
            ".git/ is closed: a hook or a config change there would run later, outside any review (a new "
            ".git/ in the workspace folder would run its config at the person's next git command here)",
            "To start a repository in this folder, run `git init` outside the kernel, in a terminal; a clone "
            f"into a subfolder works from here. {STOP}",
        )
    if closed == ".git":
        return refuse(".git/ is closed: a hook or a config change there would run later, outside any review", STOP)
    if closed == ".ivralo":
        return refuse(".ivralo/ holds ivralo's own records (history, permissions) and grants", STOP)
    name = os.path.basename(path)
    if name == names.DOTENV_FILE or name.startswith(names.DOTENV_FILE + "."):
        return refuse(".env files are read by ivralo when a kernel starts and hold credentials", STOP)
    if policy.config_home_is_workspace:
        first = _parts(os.path.relpath(path, policy.workspace))[0]
        if name in CONFIG_FILES or first in CONFIG_DIRS:
            return refuse(f"{name} is ivralo's configuration, and a grant", STOP)
    home = policy.home_inside
    in_home = home and _inside(path, home) and path != home and not any(_inside(path, p) for p in policy.home_kept_open)
    if in_home and _parts(os.path.relpath(path, home))[0].startswith("."):
        return refuse(
            f"{path} is in a dot-entry of the home folder (the workspace holds it): shells, ssh, git and "
            "editors run or trust what is there, outside any review",
            STOP,
        )
    if in_home and os.path.dirname(path) == home and not os.path.lexists(path):
        return refuse(
            f"{path} would be a new entry at the top of the home folder (the workspace holds it): that level "
            "stays as it is, so that no new dot-file or tool folder can appear there (shells, ssh, git and "
            "editors run or trust what is there)",
            "Work in a subfolder that is already there, or make one outside the kernel (mkdir ~/work in a "
            f"terminal) and start the kernel there; files already at the top can be written. {STOP}",
        )
    for tool in policy.closed_tools:
        if _inside(path, tool):
            return refuse(
                f"{os.path.relpath(tool, policy.workspace)} is closed: other tools (an editor, git, direnv, CI) "
                "or the host read or run it by themselves when the folder is next opened, outside any review",
                f"Change it outside the kernel (in your editor or a terminal), where you see what it does. {STOP}",
            )
    return None


SHELLS = frozenset({"sh", "bash", "dash", "zsh"})
GIT_OPTIONS_WITH_VALUE = frozenset({"-C", "-c", "--git-dir", "--work-tree", "--namespace", "--exec-path"})
INIT_OPTIONS_WITH_VALUE = frozenset({"-b", "--initial-branch", "--template", "--separate-git-dir", "--object-format"})


def _git_init_folder(words: list[str], cwd: str) -> str | None:
    """The folder ``git [options] init [options] [folder]`` would make its ``.git`` in, if it is that."""
    if not words or os.path.basename(words[0]) != "git":
        return None
    folder, i = cwd, 1
    while i < len(words) and words[i].startswith("-"):
        if words[i] == "-C" and i + 1 < len(words):
            folder = os.path.join(folder, words[i + 1])
        i += 2 if words[i] in GIT_OPTIONS_WITH_VALUE else 1
    if i >= len(words) or words[i] != "init":
        return None
    i += 1
    while i < len(words) and words[i].startswith("-"):  # --bare too: git's discovery takes the folder itself
        i += 2 if words[i] in INIT_OPTIONS_WITH_VALUE else 1
    target = words[i] if i < len(words) and words[i] not in ("&&", "||", ";", "|") else "."
    return os.path.realpath(os.path.join(folder, target))


def decide_start(args: object, cwd: str, policy: FsPolicy) -> GuardRefusal | None:
    """A ``git init`` of the workspace folder itself, refused with the write guard's sentence before it
    runs (the sandbox would stop its writes; this says why and what to do). A shell line that changes
    folder (``cd sub && git init``) is left to the OS: a repository in a subfolder is allowed."""
    if isinstance(args, (str, bytes)):
        try:
            words = shlex.split(os.fsdecode(args))
        except ValueError:
            return None
        if any(w in ("cd", "pushd") for w in words):
            return None
        starts = [i for i, w in enumerate(words) if os.path.basename(w) == "git"]
        folders = [_git_init_folder(words[i:], cwd) for i in starts]
    elif isinstance(args, (list, tuple)):
        words = [os.fsdecode(a) for a in args if isinstance(a, (str, bytes))]
        if len(words) >= 3 and os.path.basename(words[0]) in SHELLS and words[1] == "-c":
            return decide_start(words[2], cwd, policy)  # IPython's !line, subprocess's shell=True
        folders = [_git_init_folder(words, cwd)]
    else:
        return None
    if policy.workspace in folders:
        return decide_write("start a repository in", os.path.join(policy.workspace, ".git"), policy)
    return None


def decide_read(operation: str, path: str, closed_reads: tuple[str, ...] = ()) -> GuardRefusal | None:
    """A cheap string check (no filesystem access): reads are the hot path. ``path`` is absolute."""
    name = os.path.basename(path.rstrip(os.sep))
    if name == names.DOTENV_FILE or (name.startswith(".env.") and operation == "open"):
        return GuardRefusal(
            guard="read guard",
            operation=operation,
            target=path,
            why=".env files hold credentials",
            instead=f"Ask the person for what you need. {STOP}",
        )
    lowered = path.casefold()
    if (".git" in lowered or ".ivralo" in lowered) and closed_component(path):
        return GuardRefusal(
            guard="read guard",
            operation=operation,
            target=path,
            why="repository internals (.git/) and ivralo's records (.ivralo/) are not readable from code",
            instead=STOP,
        )
    for store in closed_reads:
        if _inside(path, store):
            return GuardRefusal(
                guard="read guard",
                operation=operation,
                target=path,
                why=f"{store} is a credential store of the person's",
                instead=f"Code reaches services through ivralo.call and ivralo.sql, which hold credentials. {STOP}",
            )
    return None
