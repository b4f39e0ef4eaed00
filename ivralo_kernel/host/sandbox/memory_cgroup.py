"""[host] A memory cgroup of its own for each kernel's tree, where cgroup v2 delegates one to the host.

The observer samples the tree's memory (RSS, tmpfs files, memfds, shared memory), so a fast allocation
can outrun it. A cgroup's limit is enforced by the Linux kernel on every page the tree is charged for:
anonymous memory, and the pages of its tmpfs files, memfds and ``/dev/shm`` (shmem is charged to the
cgroup of the process that first touches it). Past the limit, the Linux kernel's OOM killer ends the
cgroup's processes (``memory.oom.group``); the watchdog reads the OOM count and says "memory".

Only **cgroup v2**, and only where its memory controller is delegated to the host's user: a child of
the host's own cgroup or of its parent, whose ``cgroup.subtree_control`` lists ``memory`` and whose
``cgroup.procs`` this user may write (a systemd unit or scope with ``Delegate=yes``, or root's own v2
hierarchy, as in some containers). Never cgroup v1: on a v1 machine the memory hierarchy belongs to
the machine (its own cgroups limit the processes already), and nothing here creates, moves or limits
a cgroup there; the observer counts the memory instead (``memory_cgroup``: auto uses a delegated v2
cgroup if there is one, required fails a start without one, off never makes one).

The tree joins its cgroup before bwrap (or the fallback's supervisor) runs a line: the launch command
is ``sh -c 'echo 0 > cgroup.procs && exec "$@"'``, so every process of the tree is in it from its
first instruction. The cgroup folder is removed when the kernel ends, after what is left in it is
killed (``cgroup.kill``; before Linux 5.14, each pid it lists).

It lives in the sandbox room: it is part of the kernel's launch (like ``limits.py``'s tmpfs sizes),
imports only protocol, and the rooms above it (watch: the OOM count; jupyter: the provisioner and the
raw launch; the CLI's doctor) all may import it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from ivralo_kernel.protocol import names

MODES = names.MEMORY_CGROUP_MODES
REMOVE_WAIT_S = 5.0  # a task that was just killed leaves its cgroup a moment after its parent reaped it
JOIN_FAILED_STATUS = 125
PREFIX = "ivralo-"
# What the observer alone does not stop, for doctor and the banner.
OBSERVER_GAP = (
    "the observer samples the tree every observer_poll_ms: an allocation faster than that (a memfd or "
    "a tmpfs file filled in one go) can take the host's memory past the limit before it is seen"
)


class MemoryCgroupUnavailable(RuntimeError):
    """``memory_cgroup='required'`` and no memory cgroup can be made here; the message says why."""


# What to do for the Linux kernel's limit, where there is none (doctor, ``required``'s error).
HOW_TO_GET_ONE = (
    "start the host in a systemd scope that delegates cgroup v2's memory controller to you "
    "(systemd-run --user --scope -p Delegate=yes jupyter lab), on a machine whose cgroups are v2"
)


@dataclass(frozen=True)
class CgroupPlace:
    """Where this host makes its kernels' cgroups (``parent``, a cgroup v2 folder), or ``parent``
    empty and ``why`` there is none."""

    parent: str
    why: str

    def report(self) -> str:
        if not self.parent:
            return f"no memory cgroup ({self.why}): {OBSERVER_GAP}"
        return f"a memory cgroup per kernel (cgroup v2, under {self.parent}): {self.why}"


def _mounts(mountinfo: str) -> list[tuple[str, str, str]]:
    """(mount point, file system type, super options) of each mount."""
    out = []
    try:
        lines = Path(mountinfo).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3:
            out.append((fields[4].replace("\\040", " "), tail[0], tail[2]))
    return out


def _own_v2_cgroup(proc_cgroup: str) -> str | None:
    """The host's cgroup v2 path (the ``0::`` line), or None."""
    try:
        lines = Path(proc_cgroup).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    return next((line[3:] for line in lines if line.startswith("0::")), None)


def _words(path: str) -> set[str]:
    try:
        return set(Path(path).read_text(encoding="ascii").split())
    except (OSError, UnicodeDecodeError):
        return set()


def _writable(folder: str) -> bool:
    return os.access(folder, os.W_OK | os.X_OK) and os.access(os.path.join(folder, "cgroup.procs"), os.W_OK)


def find_place(proc_cgroup: str = "/proc/self/cgroup", mountinfo: str = "/proc/self/mountinfo") -> CgroupPlace:
    """The cgroup v2 folder a kernel's memory cgroup can be made under, or why there is none. It only
    reads: doctor, the tests' skips and every start ask the same question."""
    mounts = _mounts(mountinfo)
    v1_memory = next(
        (point for point, fstype, options in mounts if fstype == "cgroup" and "memory" in options.split(",")),
        None,
    )
    v1_note = (
        f"; this machine's memory controller is cgroup v1's ({v1_memory}), which belongs to the machine: "
        "ivralo never makes, moves or limits a cgroup v1"
        if v1_memory
        else ""
    )
    v2_mount = next((point for point, fstype, _ in mounts if fstype == "cgroup2"), None)
    own = _own_v2_cgroup(proc_cgroup)
    if v2_mount is None or own is None:
        return CgroupPlace("", f"no cgroup v2 file system is mounted{v1_note}")
    here = os.path.normpath(v2_mount + "/" + own)
    for folder in (here, os.path.dirname(here)):
        if not (folder + "/").startswith(v2_mount.rstrip("/") + "/"):
            continue
        if "memory" in _words(os.path.join(folder, "cgroup.subtree_control")) and _writable(folder):
            return CgroupPlace(folder, "cgroup v2's memory controller is delegated there")
    if "memory" not in _words(os.path.join(here, "cgroup.controllers")):
        why = f"cgroup v2 ({v2_mount}) has no memory controller for the host's cgroup"
    else:
        why = (
            f"cgroup v2's memory controller is not delegated to this user: neither the host's cgroup nor its "
            f"parent (under {v2_mount}) enables it for children this user may write"
        )
    return CgroupPlace("", why + v1_note)


class KernelCgroup:
    """One kernel's memory cgroup (v2): made with its limit before the tree starts, removed after."""

    def __init__(self, place: CgroupPlace, limit_bytes: int, limit_name: str) -> None:
        self.limit_bytes, self.limit_name = limit_bytes, limit_name
        self.path = os.path.join(place.parent, f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
        os.mkdir(self.path, 0o755)
        try:
            self._write("memory.max", str(limit_bytes))
            with contextlib.suppress(FileNotFoundError):  # no swap controller: no swap is charged
                self._write("memory.swap.max", "0")
            with contextlib.suppress(OSError):  # Linux < 4.19: the watchdog ends the rest
                self._write("memory.oom.group", "1")  # the whole tree goes at once
        except OSError:
            self.remove()
            raise

    def _write(self, name: str, value: str) -> None:
        with open(os.path.join(self.path, name), "w", encoding="ascii") as f:
            f.write(value)

    def _read(self, name: str) -> str:
        try:
            return Path(self.path, name).read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError):
            return ""

    def join_command(self, cmd: list[str]) -> list[str]:
        """``cmd``, started in this cgroup: the shell moves itself in ("0" is the writer), then becomes
        ``cmd`` (same pid). A failed move ends the start with status 125 and says so on stderr."""
        script = (
            'echo 0 > "$0" || { echo "ivralo: could not join the kernel\'s memory cgroup $0" >&2; '
            f'exit {JOIN_FAILED_STATUS}; }}; exec "$@"'
        )
        return ["/bin/sh", "-c", script, os.path.join(self.path, "cgroup.procs"), *cmd]

    def pids(self) -> list[int]:
        return [int(word) for word in self._read("cgroup.procs").split() if word.isdigit()]

    def oom_kills(self) -> int:
        """How many processes the Linux kernel's OOM killer ended in this cgroup."""
        for line in self._read("memory.events").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    def peak_bytes(self) -> int:
        text = self._read("memory.peak").strip()  # Linux 5.19+
        return int(text) if text.isdigit() else 0

    def oom_cause(self) -> str:
        return (
            f"memory: the kernel's memory cgroup reached {self.limit_name}={self.limit_bytes} (its RSS, tmpfs "
            "files, memfds and shared memory, counted by the Linux kernel) and the Linux kernel's OOM killer "
            "ended it"
        )

    def kill_all(self) -> None:
        """Every process still in the cgroup (a setsid child escapes the tree, never its cgroup)."""
        if os.path.exists(os.path.join(self.path, "cgroup.kill")):  # Linux 5.14+
            with contextlib.suppress(OSError):
                self._write("cgroup.kill", "1")
            return
        for _ in range(3):  # a fork between the read and the kill is caught by the next pass
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    def remove(self, wait_s: float = REMOVE_WAIT_S) -> bool:
        """Kill what is left and remove the folder; False if it is still there after ``wait_s``."""
        deadline = time.monotonic() + wait_s
        while True:
            self.kill_all()
            try:
                os.rmdir(self.path)
                return True
            except FileNotFoundError:
                return True
            except OSError:  # EBUSY: a killed task has not left yet
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.01)


def cgroup_limit(hard_bytes: int | None, data_bytes: int | None) -> tuple[int, str]:
    """The cgroup's limit and the setting it comes from: the hard limit (what the observer kills at),
    else the kernel's memory limit (``memory_limit_bytes``; None: half of the machine's memory)."""
    if hard_bytes is not None:
        return hard_bytes, "memory_hard_limit_bytes"
    if data_bytes is not None:
        return data_bytes, "memory_limit_bytes"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2, "memory_limit_bytes (half the machine's)"


def sweep(parent: str) -> list[str]:
    """Remove the kernels' cgroups a host that is gone left behind (one killed by SIGKILL cannot
    remove its own): empty ones named with a pid no process has. Returns what was removed."""
    removed: list[str] = []
    try:
        found = [name for name in os.listdir(parent) if name.startswith(PREFIX)]
    except OSError:
        return removed
    for name in found:
        pid = name[len(PREFIX) :].split("-")[0]
        if not pid.isdigit() or int(pid) == os.getpid() or os.path.exists(f"/proc/{pid}"):
            continue
        with contextlib.suppress(OSError):  # not empty (its tree still runs), or another host took it
            os.rmdir(os.path.join(parent, name))
            removed.append(os.path.join(parent, name))
    return removed


def make(mode: str, hard_bytes: int | None, data_bytes: int | None) -> tuple[KernelCgroup | None, str]:
    """A kernel's cgroup per ``mode`` (``MODES``), or None; and the sentence for the banner."""
    if mode == "off":
        return None, f"no memory cgroup (turned off by memory_cgroup='off'): {OBSERVER_GAP}"
    place = find_place()
    problem = place.why
    if place.parent:
        sweep(place.parent)
        limit, name = cgroup_limit(hard_bytes, data_bytes)
        try:
            return KernelCgroup(place, limit, name), place.report()
        except OSError as exc:
            problem = f"a cgroup could not be made under {place.parent}: {exc.strerror or exc}"
    if mode == "required":
        raise MemoryCgroupUnavailable(
            f"memory_cgroup is 'required' but no memory cgroup can be made for the kernel: {problem}. To get "
            f"one, {HOW_TO_GET_ONE}; or set memory_cgroup='auto' to let the observer count memory instead"
        )
    return None, f"no memory cgroup ({problem}): {OBSERVER_GAP}"
