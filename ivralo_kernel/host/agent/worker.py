"""[host] ``Worker``: one started, ready kernel, with the manager and client that reach it.

Ready means the kernel's ``kernel_info_reply`` carries the ``ivralo`` section (pid, bootstrap
time): a process that is up but not answering is not a worker yet. A start that does not get there
within ``bootstrap_timeout_ms`` is killed and explained (``WorkerBootstrapError``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from jupyter_client.asynchronous.client import AsyncKernelClient

from ivralo_kernel.host.agent.dataplane import Exchange, checked_size, decode_segment, kernel_json
from ivralo_kernel.host.agent.kernel_worker import Asker, KernelHost, Transfer
from ivralo_kernel.host.history.ledger import HistoryRecorder
from ivralo_kernel.host.jupyter.interpreters import KernelLaunch
from ivralo_kernel.host.jupyter.manager import IvraloKernelManager
from ivralo_kernel.host.off_loop import off_loop
from ivralo_kernel.host.sandbox.bwrap import SandboxUnavailable
from ivralo_kernel.host.settings.config import WorkerConfig
from ivralo_kernel.host.watch.outcome import Outcome
from ivralo_kernel.host.watch.processes import tree_of
from ivralo_kernel.host.watch.watchdog import Watchdog
from ivralo_kernel.protocol import WorkerBootstrapError, names
from ivralo_kernel.protocol.worker_log import last_start_failure


@dataclass(frozen=True)
class WorkerSettings:
    workspace: str
    config: WorkerConfig
    role: str = names.ROLE_SPECIALIST
    python: str | None = None
    launch: KernelLaunch | None = None  # the interpreter chosen (None: ``python``, or ivralo's own)

    def provisioner_config(self) -> dict[str, Any]:
        """Every kernel setting, so the provisioner applies this session's values and nothing else."""
        settings = self.config.settings.kernel_settings()
        settings.update(workspace=self.workspace, role=self.role)
        return settings


class Worker:
    """A kernel this host started (a ``KernelWorker``): its manager, its client, its provisioner."""

    def __init__(self, km: IvraloKernelManager, kc: AsyncKernelClient, kernel_info: dict[str, Any]) -> None:
        self.km, self.kc, self.kernel_info = km, kc, kernel_info
        self.last_used = time.monotonic()
        self.busy = False  # a call is in flight: never swept as idle
        self.retired: str | None = None  # why the pool ended it (idle, pool closed), if it did
        self.exchange: Exchange | None = None  # the namespace API's shared-memory segment, once used

    @classmethod
    async def start(cls, settings: WorkerSettings) -> Worker:
        launch = settings.launch
        python, env = (launch.python, launch.env()) if launch else (settings.python, None)
        km = IvraloKernelManager.for_settings(python=python, env=env, **settings.provisioner_config())
        try:
            await km.start_kernel(cwd=settings.workspace)
        except SandboxUnavailable as exc:  # bwrap's own words are in it; nothing was left running
            km.cleanup_connection_file()
            raise WorkerBootstrapError(str(exc)) from None
        except BaseException:  # cancelled mid-launch (a pool closing while its spare starts): what it launched ends
            provisioner = km.provisioner
            with contextlib.suppress(Exception):
                if provisioner is not None:
                    await provisioner.kill()
                    await provisioner.cleanup(restart=False)  # its folders (runtime, exchange) too
            km.cleanup_connection_file()
            raise
        kc = km.client()
        kc.start_channels()
        budget_ms = settings.config.bootstrap_timeout_ms
        deadline = time.monotonic() + budget_ms / 1000
        try:
            await kc.wait_for_ready(timeout=budget_ms / 1000)
            reply = await kc.kernel_info(reply=True, timeout=max(0.1, deadline - time.monotonic()))
            section = reply["content"].get(names.KERNEL_INFO_SECTION) or {}
            if not section.get("pid") or section.get("bootstrap_ms") is None:
                raise RuntimeError("its kernel_info_reply has no ivralo section: this is not an ivralo kernel")
        except (RuntimeError, TimeoutError) as exc:
            raise await cls(km, kc, {})._bootstrap_failed(settings, exc) from None
        except BaseException:  # cancelled (a pool closing while its spare starts): its tree ends too
            await cls(km, kc, {}).stop()
            raise
        return cls(km, kc, reply["content"])

    async def _bootstrap_failed(self, settings: WorkerSettings, exc: BaseException) -> WorkerBootstrapError:
        """Kill the half-started worker and say why it did not come up, and where to read more."""
        budget_ms = settings.config.bootstrap_timeout_ms
        supervisor = self.supervisor_pid
        kernel = tree_of(supervisor)[1:2] if supervisor else []
        diagnosis = self.watchdog.observer.boot_diagnosis() if self.watchdog else "not observed"
        died = not await self.km.is_alive()
        started = time.time()
        await self.stop()  # the supervisor records the last stage and the stderr tail
        log = Path(settings.workspace) / names.WORKER_LOG
        stage, tail = last_start_failure(log, since=started - budget_ms / 1000 - 5)
        why = f"it exited: {exc}" if died else f"no ivralo kernel_info_reply within the bootstrap budget; {diagnosis}"
        return WorkerBootstrapError(
            f"ivralo worker pid={kernel[0] if kernel else '?'} (supervisor {supervisor}) did not become ready "
            f"within {budget_ms} ms ({why}); last stage: {stage}; stderr tail: {tail or '(empty)'}. "
            f"Details in {log}. If the machine is just slow, raise WorkerConfig.bootstrap_timeout_ms."
        )

    @property
    def host(self) -> KernelHost | None:
        """The kernel's provisioner (an ``IvraloProvisioner``: ``IvraloKernelManager`` starts no other)."""
        return cast("KernelHost | None", self.km.provisioner)

    @property
    def pid(self) -> int | None:
        """The kernel process (not the supervisor)."""
        pid = (self.kernel_info.get(names.KERNEL_INFO_SECTION) or {}).get("pid")
        if not pid:
            return None
        host = self.host  # in a sandbox it reports its inner pid
        return int(host.host_pid(int(pid))) if host is not None else int(pid)

    @property
    def supervisor_pid(self) -> int | None:
        return self.host.supervisor_pid() if self.host is not None else None

    @property
    def watchdog(self) -> Watchdog | None:
        return self.host.watchdog if self.host is not None else None

    def exit_status(self) -> int | None:
        process = self.host.process if self.host is not None else None
        return process.poll() if process is not None else None

    def outcome(self, msg_id: str) -> Outcome:
        """How ``msg_id`` ends; the provisioner's watchdog decides a loss (a kernel without one: only
        its reply does)."""
        watchdog = self.watchdog
        return watchdog.outcome(msg_id) if watchdog is not None else Outcome(msg_id)

    def take_session(self, grants: frozenset[str], ask: Asker | None, on_asking: Callable[[bool], None]) -> None:
        """The grants go to the kernel's broker; its questions (e.g. an unknown host) to ``ask``, on the
        calling loop (the broker asks from its own thread)."""
        host = self.host
        if host is None:
            return
        host.set_broker_grants(grants)
        broker = host.broker
        if broker is None:
            return
        if ask is None:
            broker.asker = None  # a pooled worker must not keep another session's asker
            return
        loop = asyncio.get_running_loop()

        async def asking(question: str, choices: tuple[str, ...]) -> str:
            return str(await ask(question, choices))

        def bridge(question: str, choices: tuple[str, ...]) -> str:
            on_asking(True)
            try:
                return asyncio.run_coroutine_threadsafe(asking(question, choices), loop).result()
            finally:  # the person's time does not count against the call's deadline
                on_asking(False)

        broker.asker = bridge

    def history_recorder(self) -> HistoryRecorder | None:
        """The provisioner's recorder of the kernel's history (host/history/ledger.py)."""
        return self.host.history_recorder if self.host is not None else None

    def _exchange(self) -> Exchange:
        if self.exchange is None:
            folder = self.host.exchange_dir if self.host is not None else None
            if not folder:
                raise RuntimeError("this worker's provisioner made no exchange folder: tables cannot be sent")
            self.exchange = Exchange(folder)
        return self.exchange

    def held_segment(self) -> tuple[str, int] | None:
        exchange = self.exchange
        if exchange is None or exchange.fd is None or exchange.path is None:
            return None
        return exchange.path, exchange.capacity

    async def fetch(self, call: Transfer, envelope: dict[str, Any], cap: int, why: str) -> Any:
        """The prepared bytes through a shared-memory segment the host reserved (it never maps it)."""
        exchange = self._exchange()
        size = checked_size(call.operation, envelope, "size", cap, why)
        held = "written" in envelope and exchange.fd is not None
        path, capacity = (exchange.path or "", exchange.capacity) if held else exchange.reserve(size)
        try:
            if held:  # the kernel wrote them while it prepared (``prepare_into``), into the segment held
                written = envelope
                key = "written"
            else:
                written = kernel_json(
                    call.operation, await call.value(f"{names.DATAPLANE_NAME}.write({path!r}, {capacity})")
                )
                key = "size"
            length = checked_size(call.operation, written, key, capacity, "the segment the host reserved")
            data = await off_loop(exchange.read, length)
            return await off_loop(decode_segment, envelope, data, length)
        except BaseException:
            exchange.discard()  # a late answer may still write: into a segment nobody reads again
            raise
        finally:
            exchange.settle()

    async def inject(self, call: Transfer, name: str, table: Any, kind: str, size: int) -> None:
        """The table's Arrow IPC stream through a shared-memory segment, bound by the kernel as ``name``."""
        exchange = self._exchange()
        path, capacity = exchange.reserve(size)
        try:
            length = await off_loop(exchange.write_table, table)
            await call.value(f"{names.DATAPLANE_NAME}.receive({name!r}, {path!r}, {capacity}, {length}, {kind!r})")
        except BaseException:
            exchange.discard()
            raise
        finally:
            exchange.settle()

    async def is_alive(self) -> bool:
        return bool(await self.km.is_alive())

    async def kill(self) -> None:
        """End the whole tree now (no shutdown request, no grace)."""
        if self.host is not None:
            await self.host.kill()

    async def stop(self) -> None:
        """Kill the tree, then release the sockets. Never waits on the threads reading from it."""
        try:
            if await self.km.is_alive():
                await self.km.shutdown_kernel(now=True)
            else:
                await self.km.cleanup_resources()
        except Exception:  # noqa: BLE001 - teardown must finish; the tree is killed below anyway
            await self.kill()
        if self.exchange is not None:
            self.exchange.close()
        self.kc.stop_channels()
