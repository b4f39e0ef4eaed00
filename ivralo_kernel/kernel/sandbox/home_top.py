"""[kernel] Without the OS sandbox (the fallback), what Landlock lets the kernel write when the
workspace holds the home folder: never the home folder's top level itself.

In the sandbox the home folder's top level is read-only, with each existing non-dot entry bound
writable over it (host/sandbox/plan.py). Landlock cannot filter by name either, but it grants per
folder: so instead of the whole workspace, each existing non-dot entry of the home folder is granted
(a folder with all it holds, a file for writing alone), and not the home folder. No new entry can
appear there, dotted or not (``~/.newtool``, ``~/.foorc``), no entry there can be removed or renamed,
and no existing dot-entry (``~/.bashrc``, ``~/.ssh``) can be written. Where the home folder is
deeper in the workspace (the workspace is ``/home``), each level on the way keeps its top as well,
its other entries granted whole.
"""

from __future__ import annotations

import os


def write_grants(workspace: str, home: str, own: tuple[str, ...] = ()) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(folders, files) to grant in place of ``workspace``, which holds ``home`` (both resolved).
    ``own``: paths in the home folder's dot-entries the kernel writes (its history folder and log),
    granted by themselves where they exist."""
    folders: list[str] = []
    files: list[str] = []
    folder = workspace
    below = os.path.relpath(home, workspace).split(os.sep) if home != workspace else []
    while True:
        toward = below.pop(0) if below else None
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            entries = []
        for entry in entries:
            if entry.name == toward or (folder == home and entry.name.startswith(".")):
                continue
            if entry.is_symlink():  # a rule would grant where it points: its target is granted where it is
                continue
            if entry.is_dir(follow_symlinks=False):
                folders.append(entry.path)
            elif entry.is_file(follow_symlinks=False):
                files.append(entry.path)
        if toward is None:
            break
        folder = os.path.join(folder, toward)
    for path in own:
        if os.path.isdir(path) and not os.path.islink(path):
            folders.append(path)
        elif os.path.isfile(path) and not os.path.islink(path):
            files.append(path)
    return tuple(dict.fromkeys(folders)), tuple(dict.fromkeys(files))
