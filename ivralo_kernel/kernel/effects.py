"""[kernel] What each execution did, for its reply's metadata (``ivralo.effects``): files created,
changed and deleted in the workspace (by anything: ``WorkspaceWatch``), with the ids of the history's
copies of what they were; hosts tried; brokered calls; processes started from Python; the tree's peak
RSS (sampled), CPU seconds and wall time. The host shows it (``Session.run``'s ``result.effects``,
``ivralo-kernel run``'s line per cell).
"""

from __future__ import annotations

import os
import threading
import time

from ivralo_kernel.kernel.tree_rss import TreeRss
from ivralo_kernel.kernel.workspace_watch import WorkspaceWatch
from ivralo_kernel.protocol.messages import CallRecord, Effects

SAMPLE_S = 0.1  # the tree's RSS is sampled this often while a cell runs


class EffectsRecorder:
    def __init__(self, workspace: str) -> None:
        self.watch = WorkspaceWatch(workspace)
        self._rss = TreeRss()  # shared with the sampler thread (it locks)
        self._started_at = 0.0
        self._cpu_at = 0.0
        self._peak = 0
        self._last = -1  # the tree's RSS at the last cell's end (-1: no cell has ended yet)
        self._sampling = threading.Event()
        self._sampler: threading.Thread | None = None

    def start(self) -> None:
        self.watch.start()

    def begin(self) -> None:
        collect = time.perf_counter()
        self.watch.begin()
        # The tree's RSS at the start is what it was when the last cell ended (an idle kernel's
        # memory stays put): one reading per cell instead of two, about 50 us off each reply's way.
        # What grew between cells is counted by the samples and the reading at this cell's end.
        self._peak = self._last if self._last >= 0 else self._rss.read()
        self._sampling.set()
        if self._sampler is None:
            self._sampler = threading.Thread(target=self._sample, name="ivralo-effects-rss", daemon=True)
            self._sampler.start()
        self._started_at, self._cpu_at = time.monotonic(), _cpu_s()
        self._collect_s = time.perf_counter() - collect

    def end(
        self, hosts: dict[str, str], calls: list[CallRecord], processes: list[str], history: dict[str, str]
    ) -> Effects:
        wall, cpu = time.monotonic() - self._started_at, _cpu_s() - self._cpu_at
        collect = time.perf_counter()
        self._sampling.clear()
        self._last = self._rss.read()
        self._peak = max(self._peak, self._last)
        files = self.watch.end()
        # A file renamed over by Python was kept first: it changed, it was not created.
        created = [p for p in files.created if p not in history]
        changed = sorted({*files.changed, *(p for p in files.created if p in history)})
        effects = Effects(
            files={"created": created, "changed": changed, "deleted": files.deleted},
            history={path: copy for path, copy in history.items() if path in changed or path in files.deleted},
            hosts=dict(hosts),
            calls=list(calls),
            processes=list(processes),
            peak_rss_bytes=self._peak,
            cpu_s=round(cpu, 3),
            wall_s=round(wall, 3),
            collect_ms=round((self._collect_s + time.perf_counter() - collect) * 1000, 3),
        )
        if files.unwatched:
            effects["files_note"] = files.unwatched
        return effects

    def _sample(self) -> None:
        while True:
            self._sampling.wait()
            time.sleep(SAMPLE_S)
            if self._sampling.is_set():
                self._peak = max(self._peak, self._rss.read())


def _cpu_s() -> float:
    """This process's CPU, and its children's that have been waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system
