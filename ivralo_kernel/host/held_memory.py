"""[host] Memory a kernel's tree holds that no process's RSS shows, read from outside (``/proc``).

A file on a tmpfs and a memfd are shmem: pages of the machine, held as long as the file (or a
descriptor, or a mapping) lives, whoever maps them. RSS counts only the pages a process has mapped
and touched, and RLIMIT_DATA counts neither; 3 GiB written to the sandbox's ``/tmp`` and to a
memfd held the host's memory under a 1 GiB limit. What is counted here, each once:

* **the sandbox's own tmpfs mounts** (``/tmp``, ``/dev/shm``, ``/dev``, the emptied folders, the
  overlay's upper layer): ``statvfs`` through ``/proc/<pid>/root``, for every tmpfs or overlay mount
  in the sandbox's mount table whose device the host's own table does not have (a bind of a host
  folder, such as the exchange folder, is the host's file system and is not counted whole);
* **memfds and files on the host's tmpfs mounts the tree holds open** (the exchange folder's
  segments, deleted or not): each descriptor's target, stat'ed through ``/proc/<pid>/fd/N`` (its
  allocated blocks), once per inode;
* **memfds and System V segments it holds only mapped** (a descriptor closed after ``mmap``):
  the mapping's length from ``/proc/<pid>/maps``, once per inode. An anonymous shared mapping
  (``/dev/zero``) is not counted here: its pages are in RSS as soon as they are touched;
* **the exchange folder** (the namespace API's data plane, on the host's ``/dev/shm``): its files
  count. The Landlock floor lets the kernel write only into the segments the host made there, and
  a segment waits there only until the kernel maps it (with MAP_POPULATE: all its pages are then
  in the kernel's RSS) and unlinks it. Not seen: a segment the kernel grew with ``write()`` and
  then closed, held by the mappings alone (the host's mapping covers only the size it made).

Pages that are both mapped and touched (a memfd the kernel also maps) count in RSS too: that
double count errs toward ending the tree, and outside an attack is rare in a Python kernel.
Also counted: the tree's inotify instances (``anon_inode:inotify``), for the kernels whose user
namespace has no limit of its own (the fallback mode).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass

SHMEM_MAP_MARKERS = ("/memfd:", "/SYSV")
INOTIFY_LINK = "anon_inode:inotify"


@dataclass(frozen=True)
class Held:
    tmpfs: int = 0  # bytes used on the sandbox's own tmpfs mounts
    shmem: int = 0  # memfds and System V segments, held open or mapped
    exchange: int = 0  # files in the exchange folder
    inotify: int = 0  # inotify instances the tree holds

    @property
    def bytes(self) -> int:
        return self.tmpfs + self.shmem + self.exchange


def _own_devices() -> tuple[set[str], set[str]]:
    """The devices (``major:minor``) of every mount the host itself sees, and of its tmpfs mounts."""
    every, tmpfs = set(), set()
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = line.split(" ")
            every.add(fields[2])
            if " - tmpfs " in line:
                tmpfs.add(fields[2])
    return every, tmpfs


def _unescape(path: str) -> str:
    r"""mountinfo writes space, tab, newline and backslash as ``\040`` and the like."""
    if "\\" not in path:
        return path
    return path.encode().decode("unicode_escape").encode("latin-1").decode(errors="surrogateescape")


def private_mounts(pid: int) -> list[tuple[str, str]]:
    """(device, mount point) of the tmpfs and overlay mounts in ``pid``'s mount table that are not
    the host's: the sandbox's own. Empty when ``pid`` shares the host's mount namespace."""
    if os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt"):
        return []
    own, _ = _own_devices()
    found: dict[str, str] = {}
    with open(f"/proc/{pid}/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = line.split(" ")
            try:
                fstype = fields[fields.index("-") + 1]
            except (ValueError, IndexError):
                continue
            device = fields[2]
            if fstype in ("tmpfs", "overlay") and device not in own:
                found.setdefault(device, _unescape(fields[4]))  # the first mount of it: the others bind it
    return list(found.items())


def tmpfs_used(pid: int, mounts: Iterable[tuple[str, str]]) -> int:
    total, seen = 0, set()
    for _device, point in mounts:
        try:
            st = os.statvfs(f"/proc/{pid}/root{point}")
        except OSError:
            continue
        if st.f_fsid in seen:  # an overlay reports its upper layer's file system
            continue
        seen.add(st.f_fsid)
        total += (st.f_blocks - st.f_bfree) * st.f_frsize
    return total


def folder_used(folder: str | None) -> int:
    if not folder:
        return 0
    total = 0
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                total += st.st_blocks * 512 if entry.is_file(follow_symlinks=False) else 0
    return total


def held(pids: Iterable[int], exchange_dir: str | None = None) -> Held:
    """What ``pids`` (one kernel's tree) hold outside RSS."""
    pids = list(pids)
    mounts: list[tuple[str, str]] = []
    root_pid = None
    for pid in pids:
        with contextlib.suppress(OSError):
            mounts = private_mounts(pid)
            root_pid = pid
            if mounts:
                break
    private = {device for device, _ in mounts}
    tmpfs = tmpfs_used(root_pid, mounts) if root_pid is not None else 0
    host_tmpfs = _own_devices()[1]
    seen: set[tuple[int, int]] = set()
    shmem = inotify = 0
    for pid in pids:
        fd_shmem, fd_inotify = _open_shmem(pid, private, host_tmpfs, seen)
        shmem += fd_shmem + _mapped_shmem(pid, private, seen)
        inotify += fd_inotify
    return Held(tmpfs, shmem, folder_used(exchange_dir), inotify)


def _device(st_dev: int) -> str:
    return f"{os.major(st_dev)}:{os.minor(st_dev)}"


def _open_shmem(pid: int, private: set[str], host_tmpfs: set[str], seen: set[tuple[int, int]]) -> tuple[int, int]:
    """(bytes of memfds and host tmpfs files the process holds open, its inotify instances)."""
    total = inotify = 0
    folder = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(folder)
    except OSError:
        return 0, 0
    for fd in fds:
        try:
            target = os.readlink(f"{folder}/{fd}")
        except OSError:
            continue
        if target == INOTIFY_LINK:
            inotify += 1
        elif target.startswith("/"):  # not a socket, a pipe or an anonymous inode
            with contextlib.suppress(OSError):
                st = os.stat(f"{folder}/{fd}")
                key, device = (st.st_dev, st.st_ino), _device(st.st_dev)
                shmem = target.startswith("/memfd:") or device in host_tmpfs
                if shmem and key not in seen and device not in private:
                    seen.add(key)
                    total += st.st_blocks * 512
    return total, inotify


def _mapped_shmem(pid: int, private: set[str], seen: set[tuple[int, int]]) -> int:
    """Bytes of memfds and System V segments mapped but not held open (no descriptor to stat):
    each mapping's length, once per inode."""
    total = 0
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            lines = [line for line in f if any(marker in line for marker in SHMEM_MAP_MARKERS)]
    except OSError:
        return 0
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6:
            continue
        span, device, inode = fields[0], fields[3], int(fields[4])
        major, _, minor = device.partition(":")
        try:
            key = (os.makedev(int(major, 16), int(minor, 16)), inode)
        except ValueError:
            continue
        if key in seen or f"{int(major, 16)}:{int(minor, 16)}" in private:
            continue
        seen.add(key)
        start, _, end = span.partition("-")
        total += int(end, 16) - int(start, 16)
    return total
