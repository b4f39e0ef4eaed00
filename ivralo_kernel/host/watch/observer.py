"""[host] Watch a kernel's whole process tree from outside (psutil) and say what it is doing.

Verdicts: ``booting`` (not ready yet), ``settled`` (idle), ``computing`` (a request is in flight and
CPU advanced within the stall window), ``stalled`` (in flight, CPU flat for the whole window) and
``unavailable`` (psutil cannot read the process). CPU and RSS are summed over the tree, so a cell
that works in a subprocess is ``computing`` too. ``describe()`` is the one line every timeout and
loss message carries.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import psutil

import ivralo_kernel.host.watch.held_memory as held_memory
from ivralo_kernel.protocol.processes import children_by_parent, descendants_of

GIB = 1 << 30


def human_bytes(n: int) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


@dataclass(frozen=True)
class Sample:
    at: float
    cpu_s: float  # user + system, summed over the tree
    rss: int  # bytes, summed over the tree
    processes: int
    state: str  # of the kernel process
    wchan: str
    threads: int
    held: int = 0  # bytes in tmpfs, memfds and the exchange folder, which RSS does not show (held_memory)
    inotify: int = 0  # inotify instances the tree holds

    @property
    def memory(self) -> int:
        """What the memory limits judge: RSS and what the tree holds outside it."""
        return self.rss + self.held


def _wchan(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/wchan", encoding="ascii") as f:
            return f.read().strip() or "-"
    except OSError:
        return "-"


class ParentLinks:
    """Who is whose child, from one scan of the process table, shared by every watchdog of this
    host process for up to ``max_age_s``.

    Finding a tree's descendants means reading every process's parent (``/proc/*/stat``): psutil's
    ``children(recursive=True)`` does it once per call, so N kernels sampled every half second cost
    N full scans of a table that holds all N trees. With 16 kernels starting at once that was the
    host's largest CPU cost (about 4 ms a scan, 30 scans a second). One shared scan, reused for a
    moment, makes it one. The values (CPU, RSS) are always read fresh; only membership may be that
    old, and a caller that must see a process forked a moment ago asks for ``max_age_s=0``.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._at = -math.inf
        self._children: dict[int, list[int]] = {}

    def descendants(self, root_pid: int, max_age_s: float) -> list[int]:
        """``root_pid``'s descendants, breadth first (the root itself is not included)."""
        with self._lock:
            now = self._clock()
            if now - self._at > max_age_s:
                self._children = children_by_parent()
                self._at = now
            children = self._children
        return descendants_of(root_pid, children)


PARENT_LINKS = ParentLinks()
SHARED_SCAN_MAX_AGE_S = 0.2  # well under the 500 ms sampling period; see ParentLinks


def sample_tree(
    root_pid: int,
    clock: Callable[[], float] = time.monotonic,
    max_age_s: float = SHARED_SCAN_MAX_AGE_S,
    exchange_dir: str | None = None,
    count_held: bool = True,
) -> Sample | None:
    """One reading of ``root_pid`` and its descendants, or None if the root is gone. ``max_age_s``:
    how old the shared scan of who is whose child may be (0: scan now). ``count_held``: read what
    the tree holds outside RSS too (the memory limits need it; a CPU reading does not)."""
    try:
        root = psutil.Process(root_pid)
    except psutil.Error:
        return None
    procs = [root]
    for pid in PARENT_LINKS.descendants(root_pid, max_age_s):
        with contextlib.suppress(psutil.Error):  # ended since the scan
            procs.append(psutil.Process(pid))
    cpu, rss = 0.0, 0
    sizes: dict[int, int] = {}
    for proc in procs:
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                cpu += times.user + times.system
                memory = proc.memory_info()
                rss += memory.rss
                sizes[proc.pid] = memory.vms
        except psutil.Error:
            continue
    main = procs[1] if len(procs) > 1 else root  # the kernel is the supervisor's first child
    try:
        state, threads = main.status(), main.num_threads()
    except psutil.Error:
        state, threads = "gone", 0
    held = held_memory.held((p.pid for p in procs), exchange_dir, sizes) if count_held else held_memory.Held()
    return Sample(clock(), cpu, rss, len(procs), state, _wchan(main.pid), threads, held.bytes, held.inotify)


CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_s_of(pid: int) -> float | None:
    """User and system CPU seconds of one process (its own, not its waited-for children's), from
    ``/proc/PID/stat`` as psutil reads them; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name is in parentheses and may itself contain spaces or ')'; utime and stime
    # are the 14th and 15th fields, the 12th and 13th after it.
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    except (IndexError, ValueError):
        return None


def tree_cpu_s(root_pid: int, max_age_s: float = SHARED_SCAN_MAX_AGE_S) -> float | None:
    """The CPU seconds ``root_pid`` and its descendants have used, summed, or None if the root is
    gone: ``sample_tree``'s ``cpu_s`` alone, one read of ``/proc/PID/stat`` a process (the deadline's
    settling checks need no memory, state or threads, and run on the path of every cell's result)."""
    root = _cpu_s_of(root_pid)
    if root is None:
        return None
    readings = (_cpu_s_of(pid) for pid in PARENT_LINKS.descendants(root_pid, max_age_s))
    return root + sum(cpu for cpu in readings if cpu is not None)  # None: ended since the scan


BOOT_FLAT_WINDOW_S = 0.5
BOOT_FLAT_CPU_SHARE = 0.06  # of one core, over that window: what a sleeping kernel's threads may use


class Observer:
    def __init__(
        self,
        root_pid: int,
        stall_window_ms: int = 5_000,
        clock: Callable[[], float] = time.monotonic,
        sampler: Callable[[int], Sample | None] | None = None,
        exchange_dir: str | None = None,
    ) -> None:
        self.root_pid = root_pid
        self.stall_window_s = stall_window_ms / 1000
        self._clock = clock
        self._sampler = sampler or (lambda pid: sample_tree(pid, clock, exchange_dir=exchange_dir))
        self.samples: deque[Sample] = deque(maxlen=256)
        self.ready = False
        self.busy = False
        self.started_at = clock()

    def poll(self) -> Sample | None:
        sample = self._sampler(self.root_pid)
        if sample is not None:
            self.samples.append(sample)
        return sample

    @property
    def last(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    def _cpu_advanced_within(self, window_s: float) -> bool | None:
        if len(self.samples) < 2:
            return None
        last = self.samples[-1]
        older = [s for s in self.samples if last.at - s.at >= window_s]
        reference = older[-1] if older else self.samples[0]
        return last.cpu_s - reference.cpu_s > 0.01

    def verdict(self) -> str:
        if not self.samples:
            return "unavailable"
        if not self.ready:
            return "booting"
        advanced = self._cpu_advanced_within(self.stall_window_s)
        if not self.busy:
            # "busy" may never have reached us (native code from a cell's first line starves the
            # kernel's IOPub thread): CPU that keeps advancing is computing, whatever IOPub said.
            return "computing" if self._cpu_advanced_within(1.0) else "settled"
        if advanced is False and self.last and self.last.at - self.samples[0].at >= self.stall_window_s:
            return "stalled"
        return "computing"

    def boot_diagnosis(self) -> str:
        """Starved (it got CPU but not enough) or stalled (it stopped making progress)."""
        if len(self.samples) < 2:
            return "no sample of the process was taken"
        first, last = self.samples[0], self.samples[-1]
        # Half a second of (almost) no CPU is a stall: a starved process gets some within that on
        # any machine; a full second would call a slow import followed by a sleep "starved". Almost:
        # the kernel's other threads (control answering the host's hello, the IOPub thread) take a
        # few milliseconds while its main thread sleeps, more on a loaded machine.
        recent = [s for s in self.samples if last.at - s.at <= BOOT_FLAT_WINDOW_S]
        span = recent[-1].at - recent[0].at if len(recent) >= 2 else 0.0
        flat = len(recent) >= 2 and recent[-1].cpu_s - recent[0].cpu_s <= max(0.01, BOOT_FLAT_CPU_SHARE * span)
        if flat:
            return f"cpu flat since last samples, state={last.state} wchan={last.wchan} (stalled)"
        return f"cpu advanced {last.cpu_s - first.cpu_s:.2f} s in {last.at - first.at:.1f} s (starved)"

    def describe(self) -> str:
        last = self.last
        verdict = self.verdict()
        if last is None:
            return f"observer: {verdict}"
        return (
            f"observer: {verdict}; last sample cpu={last.cpu_s:.2f}s rss={human_bytes(last.rss)} "
            + (f"held outside rss={human_bytes(last.held)} " if last.held else "")
            + f"state={last.state} wchan={last.wchan} threads={last.threads} processes={last.processes}"
        )
