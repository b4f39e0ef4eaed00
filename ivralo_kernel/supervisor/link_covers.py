"""[supervisor] Keep each closed name that is a symlink (``.vscode -> ../shared-vscode``) the link it
was, for the sandbox's life: a mount on the link itself.

bwrap's mounts follow a link, so the host closes a linked name where it points (read-only there), but
the link is a plain entry of the writable workspace: ``rm .vscode && mkdir .vscode`` would put a new
folder of the kernel's in its place, which the editor reads on the host. A mount point cannot be
removed or renamed over (EBUSY), so the link gets one: a clone of itself mounted on itself, with the
new mount API, whose ``move_mount`` without ``MOVE_MOUNT_T_SYMLINKS`` lands on the link's own dentry
(``mount(2)`` would follow it). Paths still resolve through it as before, relative links too, so
code inside reads ``.vscode/settings.json`` where the person keeps it (read-only there).

This needs CAP_SYS_ADMIN in the sandbox's user namespace: bwrap gives it for this alone, and the
supervisor drops it (``namespace_limits.drop_given_capabilities``) before anything of the kernel's
runs; ``open_tree`` and ``move_mount`` are then refused by a seccomp filter of their own
(``protocol.seccomp.after_covers_filter``), since bwrap's filter leaves them to this step.
"""

from __future__ import annotations

import ctypes
import json
import os
import stat

# The unified syscall table's numbers (>= 424), the same on x86_64 and aarch64.
SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
AT_FDCWD = -100
OPEN_TREE_CLONE = 1
AT_SYMLINK_NOFOLLOW = 0x100
MOVE_MOUNT_F_EMPTY_PATH = 0x4


class CoverError(OSError):
    """A link could not be covered; the message names it and Linux's reason."""


def parse(text: str) -> list[str]:
    """The host's JSON list of absolute paths (anything else is refused)."""
    paths = json.loads(text)
    if not isinstance(paths, list) or not all(isinstance(p, str) and os.path.isabs(p) for p in paths):
        raise ValueError("IVRALO_COVER_LINKS is not a JSON list of absolute paths")
    return paths


def cover(path: str) -> bool:
    """Mount the link at ``path`` over itself. False when ``path`` is no longer a link (nothing to
    keep); raises CoverError when Linux refuses (a kernel before 5.2 has no ``open_tree``)."""
    try:
        if not stat.S_ISLNK(os.lstat(path).st_mode):
            return False
    except FileNotFoundError:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    encoded = os.fsencode(path)
    fd = libc.syscall(SYS_OPEN_TREE, AT_FDCWD, encoded, OPEN_TREE_CLONE | AT_SYMLINK_NOFOLLOW | os.O_CLOEXEC)
    if fd < 0:
        err = ctypes.get_errno()
        raise CoverError(err, f"open_tree({path!r}) failed: {os.strerror(err)}")
    try:
        # No MOVE_MOUNT_T_SYMLINKS: the target's last component is not followed.
        done = libc.syscall(SYS_MOVE_MOUNT, fd, b"", AT_FDCWD, encoded, MOVE_MOUNT_F_EMPTY_PATH)
        if done != 0:
            err = ctypes.get_errno()
            raise CoverError(err, f"move_mount onto {path!r} failed: {os.strerror(err)}")
    finally:
        os.close(fd)
    return True


def cover_all(text: str) -> tuple[int, list[str]]:
    """(how many links were covered, why each other one was not)."""
    covered, problems = 0, []
    for path in parse(text):
        try:
            covered += cover(path)
        except CoverError as exc:
            problems.append(str(exc))
    return covered, problems
