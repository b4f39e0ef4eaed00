"""[protocol] Keep each closed name that is a symlink (``.vscode -> ../shared-vscode``) the link it
was, for the sandbox's life: a mount on the link itself.

bwrap's mounts follow a link, so the host closes a linked name where it points (read-only there), but
the link is a plain entry of the writable workspace: ``rm .vscode && mkdir .vscode`` would put a
folder of the kernel's in its place, which the editor reads on the host. A mount point cannot be
removed or renamed over (EBUSY), so the link gets one: a clone of itself mounted on itself, with the
new mount API, whose ``move_mount`` without ``MOVE_MOUNT_T_SYMLINKS`` lands on the link's own dentry
(``mount(2)`` would follow it). Paths resolve through it as before, relative links too, so code
inside reads ``.vscode/settings.json`` where the person keeps it (read-only there).

Nothing inside the sandbox can make that mount: for a user other than root, bwrap builds the mounts
in a user namespace of its own and runs the sandbox in a nested one, which holds no capability over
them (``--cap-add CAP_SYS_ADMIN`` would not help), and the kernel's tree has no capability and a
seccomp filter against every mount call anyway. So the host does it, from outside: a short-lived
process (``python -I -S .../link_mounts.py PID PATHS``, stdlib only; ``setns`` into a user namespace
needs a single thread) joins the namespace that owns the sandbox's mounts (its creator's uid has
every capability there) and the sandbox's mount namespace, and covers each link. The supervisor waits
until each is a mount point in its mount table before it starts the kernel (``wait_until_covered``).
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import stat
import sys
import time

# The unified syscall table's numbers (>= 424), the same on x86_64 and aarch64.
SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
AT_FDCWD = -100
OPEN_TREE_CLONE = 1
AT_SYMLINK_NOFOLLOW = 0x100
MOVE_MOUNT_F_EMPTY_PATH = 0x4
NS_GET_PARENT = 0xB702  # _IO(0xb7, 0x2): the user namespace a namespace was created in
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MOUNTINFO = "/proc/self/mountinfo"


class CoverError(OSError):
    """A link could not be covered; the message names it and Linux's reason."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _fail(call: str) -> CoverError:
    err = ctypes.get_errno()
    return CoverError(err, f"{call} failed: {os.strerror(err)}")


def cover(path: str) -> bool:
    """Mount the link at ``path`` over itself, in this process's mount namespace. False when
    ``path`` is no longer a link (nothing to keep); raises CoverError when Linux refuses."""
    try:
        if not stat.S_ISLNK(os.lstat(path).st_mode):
            return False
    except FileNotFoundError:
        return False
    libc = _libc()
    encoded = os.fsencode(path)
    fd = libc.syscall(SYS_OPEN_TREE, AT_FDCWD, encoded, OPEN_TREE_CLONE | AT_SYMLINK_NOFOLLOW | os.O_CLOEXEC)
    if fd < 0:
        raise _fail(f"open_tree({path!r})")
    try:
        # No MOVE_MOUNT_T_SYMLINKS: the target's last component is not followed.
        if libc.syscall(SYS_MOVE_MOUNT, fd, b"", AT_FDCWD, encoded, MOVE_MOUNT_F_EMPTY_PATH) != 0:
            raise _fail(f"move_mount onto {path!r}")
    finally:
        os.close(fd)
    return True


def enter_sandbox(pid: int) -> None:
    """Join the mount namespace of process ``pid`` (in the sandbox), by way of the user namespace that
    owns it: the sandbox's own where that owns it (root's bwrap), else the one it was made in."""
    libc = _libc()
    user = os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    mnt = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        mine = os.stat("/proc/self/ns/user").st_ino
        try:
            parent = fcntl.ioctl(user, NS_GET_PARENT)
        except OSError:
            parent = -1
        # A nested namespace (everybody but root): its parent is bwrap's, which owns the mounts.
        owner = parent if parent >= 0 and os.fstat(parent).st_ino != mine else user
        if libc.setns(owner, CLONE_NEWUSER) != 0:
            raise _fail("setns(the sandbox's user namespace)")
        if libc.setns(mnt, CLONE_NEWNS) != 0:
            raise _fail("setns(the sandbox's mount namespace)")
        if parent >= 0:
            os.close(parent)
    finally:
        os.close(user)
        os.close(mnt)
    os.chdir("/")


def mount_points(mountinfo: str = MOUNTINFO) -> set[str]:
    """The mount points in a mount table (mountinfo writes space, tab, newline and backslash as \\ooo)."""
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return set()
    points = set()
    for line in lines:
        fields = line.split(" ")
        if len(fields) > 4:
            point = fields[4]
            for code in ("\\040", "\\011", "\\012", "\\134"):
                point = point.replace(code, chr(int(code[1:], 8)))
            points.add(point)
    return points


def wait_until_covered(paths: list[str], timeout_s: float, poll_s: float = 0.01) -> list[str]:
    """For the supervisor: wait until each link in ``paths`` (that is still a link) is a mount point
    here, or ``timeout_s`` passed. The ones left uncovered (empty when all are)."""
    deadline = time.monotonic() + timeout_s
    while True:
        points = mount_points()
        left = [p for p in paths if p not in points and os.path.islink(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(poll_s)


def parse(text: str) -> list[str]:
    """The host's JSON list of absolute paths (anything else is refused)."""
    paths = json.loads(text)
    if not isinstance(paths, list) or not all(isinstance(p, str) and os.path.isabs(p) for p in paths):
        raise ValueError("not a JSON list of absolute paths")
    return paths


def main(argv: list[str]) -> int:
    """``PID PATHS``: cover each link in the sandbox of ``PID``; one line per link Linux refused."""
    try:
        pid, paths = int(argv[0]), parse(argv[1])
        enter_sandbox(pid)
    except (IndexError, ValueError, OSError) as exc:
        print(f"cannot enter the sandbox: {exc}", file=sys.stderr)
        return 1
    status = 0
    for path in paths:
        try:
            cover(path)
        except CoverError as exc:
            print(str(exc), file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
