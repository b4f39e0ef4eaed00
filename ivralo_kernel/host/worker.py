"""[host] ``Worker``: one started, ready kernel, with the manager and client that reach it.

Ready means the kernel's ``kernel_info_reply`` carries the ``ivralo`` section (pid, bootstrap
time): a process that is up but not answering is not a worker yet. A start that does not get there
within ``bootstrap_timeout_ms`` is killed and explained (``WorkerBootstrapError``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_client.asynchronous.client import AsyncKernelClient

from ivralo_kernel.host.config import WorkerConfig
from ivralo_kernel.host.dataplane import Exchange
from ivralo_kernel.host.interpreters import KernelLaunch
from ivralo_kernel.host.manager import IvraloKernelManager
from ivralo_kernel.host.processes import tree_of
from ivralo_kernel.host.sandbox import SandboxUnavailable
from ivralo_kernel.host.watchdog import Watchdog
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
    def pid(self) -> int | None:
        """The kernel process (not the supervisor)."""
        pid = (self.kernel_info.get(names.KERNEL_INFO_SECTION) or {}).get("pid")
        if not pid:
            return None
        mapper = getattr(self.km.provisioner, "host_pid", None)  # in a sandbox it reports its inner pid
        return int(mapper(int(pid))) if mapper else int(pid)

    @property
    def supervisor_pid(self) -> int | None:
        find = getattr(self.km.provisioner, "supervisor_pid", None)
        return find() if callable(find) else getattr(self.km.provisioner, "pid", None)

    @property
    def watchdog(self) -> Watchdog | None:
        return getattr(self.km.provisioner, "watchdog", None)

    def exit_status(self) -> int | None:
        process = getattr(self.km.provisioner, "process", None)
        return process.poll() if process is not None else None

    async def is_alive(self) -> bool:
        return bool(await self.km.is_alive())

    async def kill(self) -> None:
        """End the whole tree now (no shutdown request, no grace)."""
        if self.km.provisioner is not None:
            await self.km.provisioner.kill()

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
            self.exchange.discard()
        self.kc.stop_channels()
