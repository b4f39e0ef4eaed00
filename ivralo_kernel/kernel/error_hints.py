"""[kernel] Sentences added under an error where people stumble on the sandbox itself, not on a guard.

A file the person put in the host's ``/tmp`` is a bare ``FileNotFoundError`` in the kernel, whose
``/tmp``, ``/var/tmp`` and ``/run`` are empty folders of its own (``host.sandbox.plan``: hidden): the
sentence says so, and how to share a file.
"""

from __future__ import annotations

import os
import re

# The sandbox's own empty folders a person's file is most often looked for in.
PRIVATE_FOLDERS = ("/tmp", "/var/tmp", "/run", "/var/run")  # noqa: S108 - named, not used
_IN_MESSAGE = re.compile(r"(?<![\w.])/(?:var/)?(?:tmp|run)(?:/[^\s'\"]*)?")


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _missing_path(value: BaseException) -> str | None:
    """The path a FileNotFoundError names: its ``filename`` (``filename2`` too), else the first
    private-folder path in its message (libraries that raise their own without ``filename``)."""
    for name in (getattr(value, "filename", None), getattr(value, "filename2", None)):
        if isinstance(name, bytes):
            name = os.fsdecode(name)
        if isinstance(name, str) and name:
            return os.path.abspath(name)
    found = _IN_MESSAGE.search(str(value))
    return found.group(0) if found else None


def private_tmp_hint(value: BaseException, workspace: str, sandboxed: bool) -> str | None:
    """The sentence for a ``FileNotFoundError`` about a path in one of the sandbox's own temp and run
    folders (not in the workspace, which may live under ``/tmp`` and is the host's), else None."""
    if not sandboxed or not isinstance(value, FileNotFoundError):
        return None
    path = _missing_path(value)
    if path is None or (workspace and _under(path, workspace)):
        return None
    folder = next((f for f in PRIVATE_FOLDERS if _under(path, f)), None)
    if folder is None:
        return None
    share = f"put it in the workspace ({workspace})" if workspace else "put it in the workspace"
    return (
        f"ivralo: {path} is not there because this kernel's {folder} is its own: the sandbox gives the kernel "
        f"empty /tmp, /var/tmp and /run folders, so files in the host's are not visible in it (and what the "
        f"kernel writes there goes with it). To share a file with the kernel, {share} and open it from there."
    )
