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
  allocated blocks), once per inode. A host that is not root cannot read that folder (the kernel is
  not dumpable); it stats a copy of each descriptor instead (``pidfd_getfd``, allowed to the owner
  of the sandbox's user namespace), listed through ``/proc/<pid>/fdinfo``;
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
import ctypes
import functools
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

SHMEM_MAP_MARKERS = ("/memfd:", "/SYSV")
INOTIFY_LINK = "anon_inode:inotify"
SYS_PIDFD_GETFD = 438  # the same number on every architecture Linux has (asm-generic)
# Reading /proc/<pid>/maps costs about 8 us a line (6 ms for a kernel that imported pandas): it is
# read again when the process's size changed (a new mapping) and every REREAD_EVERY-th sample
# anyway (a mapping swapped for one of the same size); the sandbox's mount table likewise. A
# descriptor's target is read when its number is new, and every REREAD_EVERY-th sample (a number
# closed and reused); the size of each memfd or tmpfs file found is read on every sample.
REREAD_EVERY = 20
_CACHE_MAX = 1024


class _Cache:
    """Per pid: (its size then, samples since, what was found)."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, int], tuple[int, int, object]] = {}

    def get(self, kind: str, pid: int, size: int) -> object | None:
        entry = self.entries.get((kind, pid))
        if entry is None or entry[0] != size or entry[1] >= REREAD_EVERY:
            return None
        self.entries[(kind, pid)] = (entry[0], entry[1] + 1, entry[2])
        return entry[2]

    def forget(self, kind: str, pid: int) -> None:
        self.entries.pop((kind, pid), None)

    def put(self, kind: str, pid: int, size: int, value: object) -> None:
        if len(self.entries) > _CACHE_MAX:
            self.entries.clear()
        self.entries[(kind, pid)] = (size, 0, value)


_CACHE = _Cache()


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


def tmpfs_used(pid: int, mounts: Iterable[tuple[str, str]]) -> tuple[int, bool]:
    """(bytes used on those mounts, whether every one was found where the table said). Each path
    is checked to be that device before it is counted: while bwrap builds the sandbox, its table
    and its root change under us (a point read as the new tmpfs root would be the host's disk)."""
    total, seen, whole = 0, set(), True
    for device, point in mounts:
        path = f"/proc/{pid}/root{point}"
        try:
            if _device(os.stat(path).st_dev) != device:
                whole = False
                continue
            st = os.statvfs(path)
        except OSError:
            whole = False
            continue
        if st.f_fsid in seen:  # an overlay reports its upper layer's file system
            continue
        seen.add(st.f_fsid)
        total += (st.f_blocks - st.f_bfree) * st.f_frsize
    return total, whole


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


def held(pids: Iterable[int], exchange_dir: str | None = None, sizes: Mapping[int, int] | None = None) -> Held:
    """What ``pids`` (one kernel's tree) hold outside RSS. ``sizes``: each process's virtual size, if
    the caller has read it already (psutil's ``vms``)."""
    pids = list(pids)
    sizes = sizes or {}
    mounts: list[tuple[str, str]] = []
    root_pid = None
    for pid in pids:
        with contextlib.suppress(OSError):
            cached = _CACHE.get("mounts", pid, 0)
            mounts = cached if isinstance(cached, list) else private_mounts(pid)
            if cached is None:
                _CACHE.put("mounts", pid, 0, mounts)
            root_pid = pid
            if mounts:
                break
    private = {device for device, _ in mounts}
    tmpfs, whole = tmpfs_used(root_pid, mounts) if root_pid is not None else (0, True)
    if not whole and root_pid is not None:
        _CACHE.forget("mounts", root_pid)  # read again next time
    host_tmpfs = _own_devices()[1]
    seen: set[tuple[int, int]] = set()
    shmem = inotify = 0
    for pid in pids:
        size = sizes.get(pid)
        if size is None:
            size = _vm_size(pid)
        fd_shmem, fd_inotify = _open_shmem(pid, private, host_tmpfs, seen, size)
        shmem += fd_shmem + _mapped_shmem(pid, private, seen, size)
        inotify += fd_inotify
    return Held(tmpfs, shmem, folder_used(exchange_dir), inotify)


def _device(st_dev: int) -> str:
    return f"{os.major(st_dev)}:{os.minor(st_dev)}"


def _open_shmem(
    pid: int, private: set[str], host_tmpfs: set[str], seen: set[tuple[int, int]], size: int
) -> tuple[int, int]:
    """(bytes of memfds and host tmpfs files the process holds open, its inotify instances).
    ``size``: the process's virtual size, part of the cache's key (a pid reused by another
    process does not inherit the old one's descriptors)."""
    total = inotify = 0
    folder = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(folder)
        descriptors: _Descriptors = _ProcFd(folder)
    except PermissionError:
        # A host that is not root: the kernel is not dumpable, so /proc/<pid>/fd is root's. Its fdinfo
        # is listable (a ptrace-read check, which the owner of the sandbox's user namespace passes) and
        # pidfd_getfd hands us a copy of each descriptor to stat: without it a memfd went uncounted.
        try:
            fds = os.listdir(f"/proc/{pid}/fdinfo")
            descriptors = _PidfdCopies(pid)
        except OSError:
            return 0, 0
    except OSError:
        return 0, 0
    cached = _CACHE.get("fds", pid, size)
    known: dict[str, str] = cached if isinstance(cached, dict) else {}
    targets: dict[str, str] = {}
    with descriptors:
        for fd in fds:
            target = known.get(fd)
            if target is None:
                target = descriptors.target(fd)
                if target is None:
                    continue
            targets[fd] = target
            if target == INOTIFY_LINK:
                inotify += 1
            elif target.startswith("/"):  # not a socket, a pipe or an anonymous inode
                st = descriptors.stat(fd)
                if st is None:
                    continue
                key, device = (st.st_dev, st.st_ino), _device(st.st_dev)
                shmem = target.startswith("/memfd:") or device in host_tmpfs
                if shmem and key not in seen and device not in private:
                    seen.add(key)
                    total += st.st_blocks * 512
    if cached is None:
        _CACHE.put("fds", pid, size, targets)
    else:
        known.clear()
        known.update(targets)
    return total, inotify


class _Descriptors:
    """A process's open descriptors, by number: what each one is (its link) and its ``stat``."""

    def __enter__(self) -> _Descriptors:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def target(self, fd: str) -> str | None:
        raise NotImplementedError

    def stat(self, fd: str) -> os.stat_result | None:
        raise NotImplementedError


class _ProcFd(_Descriptors):
    """Through ``/proc/<pid>/fd`` (a root host, or a dumpable process of ours)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def target(self, fd: str) -> str | None:
        try:
            return os.readlink(f"{self.folder}/{fd}")
        except OSError:
            return None

    def stat(self, fd: str) -> os.stat_result | None:
        try:
            return os.stat(f"{self.folder}/{fd}")
        except OSError:
            return None


class _PidfdCopies(_Descriptors):
    """Through a copy of each descriptor (``pidfd_getfd``, Linux 5.6), closed at once: it is only
    stat'ed and its link read, never read or written."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.pidfd = -1

    def __enter__(self) -> _Descriptors:
        with contextlib.suppress(OSError):
            self.pidfd = os.pidfd_open(self.pid)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.pidfd >= 0:
            os.close(self.pidfd)

    def _copy(self, fd: str) -> int:
        if self.pidfd < 0 or not fd.isdigit():
            return -1
        return int(_libc().syscall(SYS_PIDFD_GETFD, self.pidfd, int(fd), 0))

    def target(self, fd: str) -> str | None:
        copy = self._copy(fd)
        if copy < 0:
            return None
        try:
            return os.readlink(f"/proc/self/fd/{copy}")
        except OSError:
            return None
        finally:
            os.close(copy)

    def stat(self, fd: str) -> os.stat_result | None:
        copy = self._copy(fd)
        if copy < 0:
            return None
        try:
            return os.fstat(copy)
        finally:
            os.close(copy)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _mapped_shmem(pid: int, private: set[str], seen: set[tuple[int, int]], size: int) -> int:
    """Bytes of memfds and System V segments mapped but not held open (no descriptor to stat):
    each mapping's length, once per inode."""
    cached = _CACHE.get("maps", pid, size)
    found = cached if isinstance(cached, list) else _shmem_mappings(pid)
    if cached is None:
        _CACHE.put("maps", pid, size, found)
    total = 0
    for key, device, length in found:
        if key in seen or device in private:
            continue
        seen.add(key)
        total += length
    return total


def _vm_size(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            return int(f.read().split(maxsplit=1)[0])
    except (OSError, ValueError, IndexError):
        return -1


def _shmem_mappings(pid: int) -> list[tuple[tuple[int, int], str, int]]:
    """((device, inode), "major:minor", length) of each memfd or System V mapping of ``pid``."""
    found: list[tuple[tuple[int, int], str, int]] = []
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            lines = [line for line in f if any(marker in line for marker in SHMEM_MAP_MARKERS)]
    except OSError:
        return found
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) < 6:
            continue
        span, device = fields[0], fields[3]
        major, _, minor = device.partition(":")
        start, _, end = span.partition("-")
        try:
            key = (os.makedev(int(major, 16), int(minor, 16)), int(fields[4]))
            length = int(end, 16) - int(start, 16)
        except ValueError:
            continue
        found.append((key, f"{int(major, 16)}:{int(minor, 16)}", length))
    return found
