"""[protocol] What a kernel may read in the fallback: Landlock's read rights as an allow list.

Without a sandbox no mount hides anything, so Landlock's ``READ_FILE``/``READ_DIR`` rights do it:
every process of the kernel's tree reads only the trees listed here. Landlock grants a tree with
everything beneath it and cannot take a part back, so a tree that holds a closed path (the home
folder holds Jupyter's runtime folder and the credential stores) is granted entry by entry, its
closed parts left out; the folder itself cannot then be listed, and an entry made in it after the
start cannot be read (the layer report says so when the workspace is such a folder).

Closed, whatever the list says: Jupyter's runtime folder (other kernels' connection files, keys
included), ivralo's config home, and the person's credential stores. The kernel's own connection
file and exchange folder are granted by themselves, inside the runtime folder.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Final

from ivralo_kernel.protocol import names

# The default list, and why each entry is on it (docs/security.md's table is this one).
SYSTEM_TREES: Final = MappingProxyType(
    {
        "/usr": "the system's programs and libraries (sh, git, curl, libc, the system's Python)",
        "/lib": "shared libraries (a link into /usr on most systems)",
        "/lib32": "shared libraries",
        "/lib64": "the dynamic loader and shared libraries",
        "/libx32": "shared libraries",
        "/bin": "programs (a link into /usr on most systems)",
        "/sbin": "programs",
        "/etc": "configuration every program reads: hosts, passwd, TLS certificates, locale, matplotlibrc",
        "/opt": "conda and vendors' installs (docker-stacks' /opt/conda)",
        "/nix/store": "Nix's packages",
        "/proc": "a process reads its own state (Python, psutil, numpy); other processes' environ, memory and "
        "descriptors stay closed by Landlock's ptrace rule",
        "/sys": "CPU and memory topology (numpy, OpenBLAS, torch)",
        "/dev": "/dev/null, /dev/urandom, ptys, GPUs",
    }
)
INTERPRETER_REASON: Final = "the interpreter: its prefix, base prefix, site-packages and every folder on sys.path"
HOME_REASON: Final = "the home folder's entries, each one but the closed ones (dotfiles, caches, models, data)"


def _inside(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip(os.sep) + os.sep)


def interpreter_trees() -> list[str]:
    """The interpreter's own trees, and the folders of editable installs (setuptools' finders map
    packages to source folders that are not on sys.path, ivralo's own among them)."""
    trees = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    trees += [p for p in sys.path if p and os.path.isabs(p)]
    # A project's interpreter: ivralo's kernel side comes from the private path, off sys.path.
    trees += [p for p in os.environ.get(names.ENV_CODE_PATH, "").split(os.pathsep) if os.path.isabs(p)]
    for name, module in list(sys.modules.items()):
        mapping = getattr(module, "MAPPING", None) if name.startswith("__editable__") else None
        if isinstance(mapping, dict):
            trees += [str(v) for v in mapping.values()]
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the ivralo_kernel package
    return [*trees, here]


def jupyter_runtime_dir(env: Mapping[str, str]) -> str:
    """Jupyter's runtime folder as jupyter_core finds it on Linux (not imported: the kernel's room)."""
    if env.get("JUPYTER_RUNTIME_DIR"):
        return env["JUPYTER_RUNTIME_DIR"]
    home = env.get("HOME") or os.path.expanduser("~")
    data = env.get("JUPYTER_DATA_DIR") or os.path.join(
        env.get("XDG_DATA_HOME") or os.path.join(home, ".local", "share"), "jupyter"
    )
    return os.path.join(data, "runtime")


def closed_reads(env: Mapping[str, str], credential_stores: Iterable[str], runtime_dirs: Iterable[str]) -> list[str]:
    """Real paths no rule may cover: the runtime folders, the config home, the credential stores."""
    from ivralo_kernel.protocol.credentials import config_home

    paths = [*runtime_dirs, str(config_home(env)), *credential_stores]
    return sorted({os.path.realpath(p) for p in paths if p} | {os.path.abspath(p) for p in paths if p})


def split_around(tree: str, closed: list[str], depth: int = 0) -> tuple[list[str], bool]:
    """``tree`` as rules that grant it without any closed path: itself when it holds none, else
    its entries, each split the same way. Returns the rules, and whether the tree had to be split.
    An entry that is a link is judged by its target (a rule follows the link)."""
    real = os.path.realpath(tree)
    if any(_inside(real, c) for c in closed):
        return [], True
    if not any(_inside(c, real) for c in closed):
        return [real], False
    if depth > 8 or not os.path.isdir(real):
        return [], True
    rules: list[str] = []
    try:
        entries = sorted(os.scandir(real), key=lambda e: e.name)
    except OSError:
        return [], True
    for entry in entries:
        rules += split_around(entry.path, closed, depth + 1)[0]
    return rules, True


def read_allow_list(
    *,
    workspace: str,
    home: str,
    own: Iterable[str],
    extra: Iterable[str],
    closed: list[str],
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The trees the kernel's tree may read: the system's, the interpreter's, the home folder's
    entries and the workspace (each split around ``closed``), the person's ``extra`` ones (split the
    same way), and the kernel's ``own`` files and folders (its temp folder, connection file, IPython's
    folder), granted exactly. Returns the rules, and the granted trees that had to be split."""
    rules: list[str] = []
    split: list[str] = []
    candidates = [*SYSTEM_TREES, *interpreter_trees(), home, workspace, *extra]
    for tree in dict.fromkeys(os.path.abspath(t) for t in candidates if t):
        if not os.path.exists(tree):
            continue
        granted, was_split = split_around(tree, closed)
        rules += granted
        if was_split and tree in (workspace, home):
            split.append(tree)
    rules += [os.path.realpath(p) for p in own if p and os.path.exists(p)]
    return tuple(dict.fromkeys(rules)), tuple(split)
