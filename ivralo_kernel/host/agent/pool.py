"""[host] ``WorkerPool``: ready workers for the sessions of one workspace.

* ``prewarm_pool_size`` ready spares, so a session's first call does not pay the start. A spare is
  ready (its ``kernel_info_reply`` arrived), not merely spawned.
* ``max_workers`` is a ceiling: past it ``acquire`` raises at once, naming the setting. No queue:
  an agent waiting on a hidden queue looks exactly like an agent whose code hangs.
* ``idle_ttl_seconds``: a worker unused that long is ended by a background sweep; its session's
  next call gets a fresh, empty namespace (that is not an error).
* ``host_memory_reserve_bytes``: no worker is started while the host (or its cgroup) has less
  memory available than that; prewarmed spares are evicted first.
* **Tables**: once a session of the pool has moved a table (``note_tables``), each spare started
  after that imports the data plane's modules (pyarrow, pandas) while it is still a spare, before
  it is offered: a fresh session's first table then pays no imports (about 0.4 s). A pool whose
  sessions never moved a table keeps its spares without them (they cost about 60 MiB each).
* Closing never waits on the threads that read from workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from ivralo_kernel.host.agent.kernel_worker import KernelWorker
from ivralo_kernel.host.agent.namespace import DATAPLANE, NamespaceCall, NamespaceTimeoutError, WorkerGone
from ivralo_kernel.host.agent.worker import Worker, WorkerSettings
from ivralo_kernel.host.jupyter.interpreters import KernelLaunch, plan
from ivralo_kernel.host.off_loop import off_loop
from ivralo_kernel.host.sandbox.limits import available_memory
from ivralo_kernel.host.settings.config import WorkerConfig
from ivralo_kernel.host.watch.observer import human_bytes
from ivralo_kernel.protocol import ConfigError, IvraloError

log = logging.getLogger(__name__)


class WorkerPoolExhaustedError(IvraloError, RuntimeError):
    """Every allowed worker is in use."""


class HostMemoryError(IvraloError, MemoryError):
    """The host is too short of memory to start another worker."""


class WorkerPool:
    """Workers (guarded kernels) for sessions to share: ready spares kept warm (``prewarm_pool_size``),
    at most ``max_workers`` at once, idle ones ended after ``idle_ttl_seconds``. ``async with
    WorkerPool(workspace, config=...) as pool``, then ``Session(pool=pool)``. Parameters after
    ``workspace`` by keyword: ``config``, ``role``, ``python`` (as ``Session``'s)."""

    def __init__(
        self,
        workspace: str | os.PathLike[str] = ".",
        *,
        config: WorkerConfig | None = None,
        role: str | None = None,
        python: str | None = None,
    ) -> None:
        config = config or WorkerConfig()
        if python is not None and config.project is not None:
            raise ConfigError("python", f"and project={config.project!r} both name the interpreter", "Give one of them")
        if role is not None:  # validated like every setting: one role model
            config = config.replace(role=role)
        self.settings = WorkerSettings(str(Path(workspace).resolve()), config, config.role, python)
        self.config = self.settings.config
        self.spares: list[Worker] = []
        self.in_use: set[KernelWorker] = set()
        self._starting = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._planning = asyncio.Lock()
        self.tables_seen = False  # a session of this pool has moved a table: spares warm the data plane

    async def __aenter__(self) -> WorkerPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def live(self) -> int:
        """Workers that exist or are starting: what ``max_workers`` counts."""
        return len(self.spares) + len(self.in_use) + self._starting

    async def start(self) -> None:
        """Begin prewarming and the idle sweep (``acquire`` also works without it)."""
        self._spawn_background(self._sweep())
        self._replenish()

    async def wait_prewarmed(self, timeout: float = 120) -> None:
        """Wait until the prewarmed spares are ready (for callers that want the warm path now)."""
        deadline = time.monotonic() + timeout
        while len(self.spares) < self.config.prewarm_pool_size and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    async def acquire(self) -> Worker:
        """A ready worker for one session: a prewarmed spare, or a new one."""
        if self._closed:
            raise WorkerPoolExhaustedError("the worker pool is closed; create a new one")
        while self.spares:
            worker = self.spares.pop()
            if await worker.is_alive():
                self.in_use.add(worker)
                worker.last_used = time.monotonic()
                self._replenish()
                return worker
            await worker.stop()
        if self.live >= self.config.max_workers:
            raise WorkerPoolExhaustedError(
                f"all {self.config.max_workers} workers are in use (max_workers={self.config.max_workers}); "
                "close an idle session or raise WorkerConfig.max_workers"
            )
        worker = await self._start_worker()
        self.in_use.add(worker)
        self._replenish()
        return worker

    async def release(self, worker: KernelWorker) -> None:
        """A session is done with its worker: its namespace is private, so it is ended, not reused.
        (Also after the pool was closed.)"""
        self.in_use.discard(worker)
        await worker.stop()
        self._replenish()

    async def interpreter(self) -> KernelLaunch:
        """The interpreter this pool's kernels run (found once: discovery and its probe start processes)."""
        async with self._planning:
            if self.settings.launch is None:
                launch = await off_loop(plan, self.config.project, self.settings.python)
                self.settings = dataclasses.replace(self.settings, launch=launch)
            assert self.settings.launch is not None
            return self.settings.launch

    async def _start_worker(self) -> Worker:
        await self._ensure_memory()
        self._starting += 1
        try:
            await self.interpreter()
            return await Worker.start(self.settings)
        finally:
            self._starting -= 1

    async def _ensure_memory(self) -> None:
        reserve = self.config.host_memory_reserve_bytes
        while available_memory() < reserve and self.spares:
            spare = self.spares.pop()
            log.warning("ivralo: host memory is below the reserve; evicting prewarmed worker %s", spare.pid)
            await spare.stop()
        available = available_memory()
        if available < reserve:
            raise HostMemoryError(
                f"not starting a worker: the host has {human_bytes(available)} available, below "
                f"host_memory_reserve_bytes={reserve} ({human_bytes(reserve)}). Close sessions you no longer "
                "need, or lower WorkerConfig.host_memory_reserve_bytes"
            )

    def note_tables(self) -> None:
        """A session of this pool moved a table: spares started from now on import what tables need."""
        self.tables_seen = True

    def _replenish(self) -> None:
        missing = self.config.prewarm_pool_size - len(self.spares) - self._starting
        room = self.config.max_workers - self.live
        for _ in range(max(0, min(missing, room))):
            self._spawn_background(self._prewarm_one())

    async def _prewarm_one(self) -> None:
        try:
            worker = await self._start_worker()
        except (HostMemoryError, IvraloError) as exc:
            log.warning("ivralo: could not prewarm a worker: %s", exc)
            return
        try:
            if self.tables_seen and not self._closed:
                await self._warm(worker)
        except BaseException:  # cancelled (the pool closes): the spare was never offered, so it ends here
            await worker.stop()
            raise
        if self._closed:
            await worker.stop()
            return
        self.spares.append(worker)
        log.info("ivralo: prewarmed worker ready (pid=%s, pool size=%d)", worker.pid, len(self.spares))

    async def _warm(self, worker: Worker) -> None:
        """The spare's data plane imported now, while it waits (``kernel.dataplane.warm``). A failure is
        only logged: the session's first table then imports them itself, as without the warm-up."""
        call = NamespaceCall(worker, "warm the data plane", self.config.namespace_timeout_ms)
        try:
            log.info("ivralo: spare %s warmed its data plane: %s", worker.pid, await call.value(f"{DATAPLANE}.warm()"))
        except (WorkerGone, NamespaceTimeoutError, ValueError) as exc:
            log.warning("ivralo: spare %s did not warm its data plane: %s", worker.pid, exc)

    async def _sweep(self) -> None:
        ttl = self.config.idle_ttl_seconds
        interval = max(0.05, min(ttl / 4, 30.0))
        while not self._closed:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for worker in list(self.in_use):
                if not worker.busy and now - worker.last_used > ttl and worker.retired is None:
                    worker.retired = f"idle for more than idle_ttl_seconds={ttl:g}"
                    await worker.kill()  # its session releases it (and its sockets) on the next call

    def _spawn_background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """End every worker's tree. Reader threads are left to exit on their own."""
        self._closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:  # a spare cancelled while it starts or warms ends its tree and folders: briefly waited for
            await asyncio.wait(tasks, timeout=10)
        spares, self.spares = self.spares, []
        for worker in spares:
            with contextlib.suppress(Exception):
                await worker.stop()
        for lent in list(self.in_use):  # a session may be reading from it: kill only, it releases
            lent.retired = "the worker pool was closed"
            with contextlib.suppress(Exception):
                await lent.kill()
