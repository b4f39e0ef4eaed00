"""[host] ``Session``: one agent's Python worker, reached over jupyter_client.

* Lazy: the kernel starts on the first call, not in the constructor.
* One call at a time: calls of one session are serialised by a lock, so two never share a worker.
* The return contract: ``run`` returns what the cell printed (and its result's text) as ``str``, or
  ``{"status", "result", "error"}`` when the cell failed or the worker was lost.
* Names, never values: after each successful call the host keeps the list of variable names, so a
  lost worker can say which variables have to be recreated.
"""

from __future__ import annotations

import ast
import asyncio
import os
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from jupyter_client.asynchronous.client import AsyncKernelClient

from ivralo_kernel.host.config import WorkerConfig
from ivralo_kernel.host.escalation import Phase
from ivralo_kernel.host.manager import IvraloKernelManager
from ivralo_kernel.host.outputs import CellOutput, error_result, lost_names_message
from ivralo_kernel.host.processes import tree_of
from ivralo_kernel.host.watchdog import Watchdog
from ivralo_kernel.host.worker_log import last_start_failure
from ivralo_kernel.protocol import KernelPolicy, WorkerBootstrapError, names

RunResult = str | dict[str, str]
T = TypeVar("T")

# Evaluated by the kernel after each successful cell (user_expressions): the names, never values.
_NAMES_EXPR = (
    "sorted(k for k in get_ipython().user_ns if not k.startswith('_') and k not in get_ipython().user_ns_hidden)"
)
_POLL_S = 0.02
# If the provisioner's watchdog has not answered by deadline + grace + this, the session ends the
# worker itself (the watchdog's own bound is deadline + grace + 250 ms).
_FALLBACK_SLACK_S = 1.0
USER_INTERRUPT_CAUSE = "interrupted: stopped at once by the user"


class Session:
    """An agent's guarded Python session. Use ``async with Session(...) as s: await s.run(code)``."""

    def __init__(
        self,
        workspace: str | os.PathLike[str] = ".",
        config: WorkerConfig | None = None,
        role: str = names.ROLE_SPECIALIST,
        grants: tuple[str, ...] = (),
        ask: Callable[[str], Awaitable[str]] | None = None,
        approve: Callable[[str], Awaitable[bool]] | None = None,
        surface: str = "project",
        gateway_url: str | None = None,
        *,
        python: str | None = None,
    ) -> None:
        self.workspace = str(Path(workspace).resolve())
        self.config = config or WorkerConfig()
        KernelPolicy(workspace=self.workspace, role=role)  # validates role now, not at first call
        self.role = role
        self.grants = tuple(grants)
        self.ask, self.approve = ask, approve
        self.surface, self.gateway_url = surface, gateway_url
        self.python = python
        self._lock = asyncio.Lock()
        self._km: IvraloKernelManager | None = None
        self._kc: AsyncKernelClient | None = None
        self._known_names: list[str] = []
        self._user_interrupt = False
        self.kernel_info: dict[str, Any] = {}

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def pid(self) -> int | None:
        """Pid of the kernel process (not the supervisor), once it is ready."""
        section = self.kernel_info.get(names.KERNEL_INFO_SECTION) or {}
        pid = section.get("pid")
        return int(pid) if pid else None

    @property
    def supervisor_pid(self) -> int | None:
        provisioner = self._km.provisioner if self._km else None
        return getattr(provisioner, "pid", None)

    async def run(self, code: str) -> RunResult:
        """Run ``code``; return its printed output, or the error dict."""
        async with self._lock:
            if self.approve is not None and not await self.approve(code):
                return error_result("", "refused: the person did not approve this code", "done_with_errors")
            try:
                kc = await self._ensure_started()
            except WorkerBootstrapError as exc:
                return error_result("", str(exc))
            return await self._execute(kc, code)

    async def _ensure_started(self) -> AsyncKernelClient:
        if self._kc is not None and self._km is not None and await self._km.is_alive():
            return self._kc
        await self._stop_kernel()
        km = IvraloKernelManager.for_settings(python=self.python, **self._provisioner_settings())
        self._km = km
        await km.start_kernel(cwd=self.workspace)
        kc = km.client()
        kc.start_channels()
        self._kc = kc
        budget_ms = self.config.bootstrap_timeout_ms
        deadline = time.monotonic() + budget_ms / 1000
        try:
            # Ready means: kernel_info_reply carries the ivralo section (pid, bootstrap_ms).
            await kc.wait_for_ready(timeout=budget_ms / 1000)
            reply = await kc.kernel_info(reply=True, timeout=max(0.1, deadline - time.monotonic()))
            section = reply["content"].get(names.KERNEL_INFO_SECTION) or {}
            if not section.get("pid") or section.get("bootstrap_ms") is None:
                raise RuntimeError("its kernel_info_reply has no ivralo section: this is not an ivralo kernel")
        except (RuntimeError, TimeoutError) as exc:
            raise await self._bootstrap_failed(budget_ms, exc) from None
        self.kernel_info = reply["content"]
        self._known_names = []
        return kc

    async def _bootstrap_failed(self, budget_ms: int, exc: BaseException) -> WorkerBootstrapError:
        """Kill the half-started worker and say why it did not come up, where to read more."""
        supervisor = self.supervisor_pid
        kernel = tree_of(supervisor)[1:2] if supervisor else []
        watchdog = self.watchdog
        diagnosis = watchdog.observer.boot_diagnosis() if watchdog else "not observed"
        died = not await self._km.is_alive() if self._km else True
        started = time.time()
        await self._stop_kernel()  # the supervisor records the last stage and stderr tail
        log = Path(self.workspace) / names.WORKER_LOG
        stage, tail = last_start_failure(log, since=started - budget_ms / 1000 - 5)
        why = f"it exited: {exc}" if died else f"no ivralo kernel_info_reply within the bootstrap budget; {diagnosis}"
        return WorkerBootstrapError(
            f"ivralo worker pid={kernel[0] if kernel else '?'} (supervisor {supervisor}) did not become ready "
            f"within {budget_ms} ms ({why}); last stage: {stage}; stderr tail: {tail or '(empty)'}. "
            f"Details in {log}. If the machine is just slow, raise WorkerConfig.bootstrap_timeout_ms."
        )

    def _provisioner_settings(self) -> dict[str, Any]:
        c = self.config
        settings: dict[str, Any] = {
            "workspace": self.workspace,
            "role": self.role,
            "deadline_ms": c.deadline_ms,
            "interrupt_before_kill": c.interrupt_before_kill,
            "interrupt_grace_ms": c.interrupt_grace_ms,
            "observer_poll_ms": c.observer_poll_ms,
            "stall_window_ms": c.stall_window_ms,
        }
        optional = {
            "memory_limit_bytes": c.memory_limit_bytes,
            "rlimit_nofile": c.rlimit_nofile,
            "memory_soft_limit_bytes": c.memory_soft_limit_bytes,
            "memory_hard_limit_bytes": c.memory_hard_limit_bytes,
        }
        settings.update({k: v for k, v in optional.items() if v})
        return settings

    @property
    def watchdog(self) -> Watchdog | None:
        return getattr(self._km.provisioner, "watchdog", None) if self._km else None

    async def _execute(self, kc: AsyncKernelClient, code: str) -> RunResult:
        msg_id = kc.execute(code, allow_stdin=False, stop_on_error=True, user_expressions={"names": _NAMES_EXPR})
        out = CellOutput()
        c = self.config
        fallback = time.monotonic() + (c.deadline_ms + c.interrupt_grace_ms) / 1000 + _FALLBACK_SLACK_S
        idle = False
        while not idle:
            if time.monotonic() >= fallback:
                return await self._lose_worker(f"timeout: execution exceeded deadline_ms={c.deadline_ms}")
            try:
                msg = await kc.get_iopub_msg(timeout=_POLL_S)
            except queue.Empty:
                assert self._km is not None
                if not await self._km.is_alive():
                    return await self._lose_worker(self._death_cause())
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["header"]["msg_type"] == "status":
                idle = msg["content"]["execution_state"] == "idle"
            else:
                out.add(msg)
        reply = await self._shell_reply(kc, msg_id)
        content = reply["content"] if reply else {}
        if content.get("status") == "ok":
            self._known_names = _names_from(content.get("user_expressions", {}).get("names"))
        notice = self.watchdog.take_soft_notice() if self.watchdog else None
        result = self._result(msg_id, out, content)
        if notice:
            if isinstance(result, str):
                return f"{result}{notice}\n"
            result["result"] += f"{notice}\n"
        return result

    def _result(self, msg_id: str, out: CellOutput, content: dict[str, Any]) -> RunResult:
        phase = self.watchdog.phase_of(msg_id) if self.watchdog else None
        if phase in (Phase.INTERRUPTING, Phase.CONFIRMING, Phase.INTERRUPTED):
            return error_result(out.text, names.INTERRUPTED_TEXT.format(deadline_ms=self.config.deadline_ms))
        if out.error is not None or content.get("status") == "error":
            error = out.error or f"{content.get('ename')}: {content.get('evalue')}"
            return error_result(out.text, error)
        return out.text

    def _death_cause(self) -> str:
        """Why the worker is gone: the user's Esc, the watchdog's kill, or a crash."""
        if self._user_interrupt:
            return USER_INTERRUPT_CAUSE
        watchdog = self.watchdog
        if watchdog is not None and watchdog.loss is not None:
            return f"{watchdog.loss.cause}; {watchdog.loss.observer}"
        observer = f"; {watchdog.observer.describe()}" if watchdog else ""
        if self._exit_status() == names.DEADLINE_EXIT_STATUS:  # the supervisor's backstop
            return f"timeout: execution exceeded deadline_ms={self.config.deadline_ms}{observer}"
        return f"crash: {self._exit_description()}{observer}"

    def _exit_status(self) -> int | None:
        process = getattr(self._km.provisioner if self._km else None, "process", None)
        return process.poll() if process is not None else None

    async def _shell_reply(self, kc: AsyncKernelClient, msg_id: str) -> dict[str, Any] | None:
        deadline = time.monotonic() + self.config.namespace_timeout_ms / 1000
        while time.monotonic() < deadline:
            try:
                reply: dict[str, Any] = await kc.get_shell_msg(timeout=_POLL_S)
            except queue.Empty:
                continue
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply
        return None

    def _exit_description(self) -> str:
        code = self._exit_status()
        if code is None:
            return "the kernel stopped answering"
        if code > 128:
            return f"the kernel was killed by signal {code - 128}"
        return f"the kernel exited with status {code}"

    async def _lose_worker(self, cause: str) -> dict[str, str]:
        lost = list(self._known_names)
        self._known_names = []
        self._user_interrupt = False
        await self._stop_kernel()
        message = lost_names_message(cause, lost)
        return error_result(message, message)

    async def _stop_kernel(self) -> None:
        kc, km = self._kc, self._km
        self._kc = self._km = None
        self.kernel_info = {}
        if kc is not None:
            kc.stop_channels()
        if km is not None:
            try:
                if await km.is_alive():
                    await km.shutdown_kernel(now=True)
                else:
                    await km.cleanup_resources()
            except Exception:  # noqa: BLE001 - teardown must finish; the tree is killed below anyway
                if km.provisioner is not None:
                    await km.provisioner.kill()

    async def interrupt(self) -> dict[str, str] | None:
        """The Esc key: end the worker and its whole tree now (no grace). The next call gets a fresh
        worker. Returns the loss message listing the variables that were lost (None if no worker ran).

        A call in flight returns the same message. (JupyterLab's interrupt button stays a plain SIGINT.)
        """
        km = self._km
        if km is None or km.provisioner is None:
            return None
        self._user_interrupt = True
        lost = list(self._known_names)
        await km.provisioner.kill()
        message = lost_names_message(USER_INTERRUPT_CAUSE, lost)
        if not self._lock.locked():  # nothing in flight will clean up after us
            async with self._lock:
                await self._lose_worker(USER_INTERRUPT_CAUSE)
        return error_result(message, message)

    async def close(self) -> None:
        """Stop the worker and its whole process tree."""
        async with self._lock:
            await self._stop_kernel()

    async def list_vars(self) -> list[str]:
        """Names of the variables the last successful call left (no values)."""
        return list(self._known_names)


def _names_from(expression_result: dict[str, Any] | None) -> list[str]:
    if not expression_result or expression_result.get("status") != "ok":
        return []
    try:
        value = ast.literal_eval(expression_result["data"]["text/plain"])
    except (KeyError, ValueError, SyntaxError):
        return []
    return [str(v) for v in value]


class SyncSession:
    """The same session for scripts: every method blocks. Runs its own event loop in a thread."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ivralo-session", daemon=True)
        self._thread.start()
        self._session: Session = self._call(_make_session(*args, **kwargs))

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> SyncSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, code: str) -> RunResult:
        return self._call(self._session.run(code))

    def list_vars(self) -> list[str]:
        return self._call(self._session.list_vars())

    @property
    def pid(self) -> int | None:
        return self._session.pid

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._call(self._session.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


async def _make_session(*args: Any, **kwargs: Any) -> Session:
    return Session(*args, **kwargs)  # built inside the loop thread: its lock binds to that loop
