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
import contextlib
import dataclasses
import json
import logging
import math
import os
import queue
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from ivralo_kernel.host.blocking import LoopThread
from ivralo_kernel.host.code_gate import DONE_WITH_ERRORS, gate_refusal, is_refusal
from ivralo_kernel.host.config import WorkerConfig
from ivralo_kernel.host.dataplane import (
    Exchange,
    TransferRefusedError,
    as_table,
    checked_size,
    decode_inline,
    decode_segment,
    ipc_size,
    require_arrow,
    transfer_cap,
)
from ivralo_kernel.host.escalation import Phase
from ivralo_kernel.host.gateway import GatewayPool, GatewayWorker, RemoteDeadline, fetch_remote, inject_remote
from ivralo_kernel.host.history_ledger import HistoryRecorder
from ivralo_kernel.host.history_store import HistoryError, HistoryStore, entry_dict, parse_time
from ivralo_kernel.host.namespace import (
    DATAPLANE,
    NamespaceCall,
    NamespaceTimeoutError,
    NamespaceWorkerLostError,
    WorkerGone,
)
from ivralo_kernel.host.off_loop import off_loop
from ivralo_kernel.host.outputs import CellOutput, effects_in, error_result, lost_names_message, with_effects
from ivralo_kernel.host.pool import HostMemoryError, WorkerPool, WorkerPoolExhaustedError, available_memory
from ivralo_kernel.host.test_runs import RUNNERS, run_report, runner_cell
from ivralo_kernel.host.watchdog import Watchdog
from ivralo_kernel.host.worker import Worker
from ivralo_kernel.protocol import ConfigError, WorkerBootstrapError, names
from ivralo_kernel.protocol.messages import Effects
from ivralo_kernel.protocol.processes import describe_exit

if TYPE_CHECKING:
    from ivralo_kernel.host.attach import AttachedSession, SyncAttachedSession

__all__ = ["NamespaceTimeoutError", "NamespaceWorkerLostError", "RunResult", "Session", "SyncSession"]
RunResult = str | dict[str, str]
AnyWorker = Worker | GatewayWorker  # a local kernel, or one a Kernel Gateway runs (host/gateway.py)
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
ABORTED_TEXT = (
    "aborted: the kernel did not run this code, because a request sent just before it failed and "
    "ipykernel drops what arrives meanwhile (stop_on_error); run it again"
)
RESTART_WINDOW_S = 60.0
RESTART_WARNING_AT = 3
log = logging.getLogger(__name__)


class Session:
    """An agent's guarded Python session. Use ``async with Session(...) as s: await s.run(code)``.

    Give ``pool=`` to share prewarmed workers between sessions (the pool's workspace, config and
    role then apply); without it the session starts its own worker on the first call.

    Parameters (all but ``workspace`` by keyword):

    - ``workspace``: the folder the kernel works in and may write (default: ``project`` if given,
      else the current folder).
    - ``config``: a ``WorkerConfig`` (deadline, memory, network, code gate...); default: the
      settings files' values.
    - ``role``: what the kernel may do ("readonly" restores nothing, for example); default: the
      config's role.
    - ``grants``: the brokered operations' grants (``ivralo.call``/``ivralo.sql``) this session has.
    - ``ask``: ``async (question, choices) -> answer``, asked when code reaches a host not yet
      allowed; None: no one to ask, so the answer is no.
    - ``approve``: ``async (code) -> bool``, asked before each run; False refuses it.
    - ``surface``: "project" (the project's packages) or "hermetic" (the standard library only).
    - ``gateway_url``: run the kernels on this Kernel Gateway (``?token=`` in it, or
      ``JUPYTER_GATEWAY_AUTH_TOKEN``) instead of this machine.
    - ``python``: the interpreter that runs the kernel (a path or a name on PATH).
    - ``project``: the project whose interpreter and packages the kernel uses.
    - ``pool``: a ``WorkerPool`` whose workers the session uses (then give neither config, role,
      python nor project).
    """

    def __init__(
        self,
        workspace: str | os.PathLike[str] | None = None,
        *,
        config: WorkerConfig | None = None,
        role: str | None = None,
        grants: tuple[str, ...] = (),
        ask: Callable[[str, tuple[str, ...]], Awaitable[str]] | None = None,
        approve: Callable[[str], Awaitable[bool]] | None = None,
        surface: str | None = None,
        gateway_url: str | None = None,
        python: str | None = None,
        project: str | os.PathLike[str] | None = None,
        pool: WorkerPool | None = None,
    ) -> None:
        given_to_pool = (("config", config), ("role", role), ("python", python), ("project", project))
        if pool is not None and any(v is not None for _, v in given_to_pool):
            given = ", ".join(n for n, v in given_to_pool if v is not None)
            raise ConfigError(
                given,
                "a Session given a pool runs on the pool's workers, so these would be ignored",
                "Give them to WorkerPool(...) instead",
            )
        if pool is not None and surface is not None and surface != pool.config.surface:
            raise ConfigError(
                "surface",
                f"{surface!r} differs from the pool's surface {pool.config.surface!r}, whose workers this session uses",
                f'Give the pool WorkerConfig(surface="{surface}"), or leave surface out',
            )
        if pool is None and surface is not None:  # validated like every setting: one surface model
            config = (config or WorkerConfig()).replace(surface=surface)
        if project is not None:  # the project surface's interpreter (host/interpreters.py)
            config = (config or WorkerConfig()).replace(project=os.fspath(project))
        if workspace is None:  # a project's kernel works in the project, unless told otherwise
            workspace = project if project is not None else "."
        if gateway_url is not None:
            _check_gateway(pool, grants, python, project)
            self._pool: WorkerPool | GatewayPool = GatewayPool(gateway_url, os.fspath(workspace), config, role)
        else:
            self._pool = pool or WorkerPool(workspace, config=config, role=role, python=python)
        self._owns_pool = pool is None
        self.workspace = self._pool.settings.workspace
        self.config = self._pool.config
        self.role = self._pool.settings.role
        self.grants = tuple(grants)
        self.ask, self.approve = ask, approve
        self.surface, self.gateway_url = self.config.surface, gateway_url
        self._gate = self.config.settings.gate_rules()  # None: the code gate is off
        self._lock = asyncio.Lock()
        self._worker: AnyWorker | None = None
        self._known_names: list[str] = []
        self._user_interrupt = False
        self._restarts: deque[tuple[float, str]] = deque()
        self._restart_note: str | None = None
        self._asked_s = 0.0  # time spent waiting for answers to ``ask`` during the running call
        self._effects: Effects | None = None  # what the last run's execution did (the kernel's word)
        self._asking_since: float | None = None

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @staticmethod
    def connect(connection_file: str, timeout_s: float | None = None) -> AttachedSession:
        """A session on a kernel the person already runs (its ``kernel-*.json``): ``async with
        Session.connect(path) as s: await s.run(code)``. ivralo did not start it, so its guards cannot
        be applied afterwards, and the first result says so; an ivralo kernel reports its ``layers``."""
        from ivralo_kernel.host.attach import AttachedSession

        return AttachedSession(connection_file, timeout_s)

    @property
    def kernel_info(self) -> dict[str, Any]:
        """The kernel's ``kernel_info_reply`` content (its ``ivralo`` section: layers, interpreter), once
        a worker started; else empty."""
        return self._worker.kernel_info if self._worker else {}

    @property
    def pid(self) -> int | None:
        """Pid of the kernel process (not the supervisor), once it is ready."""
        return self._worker.pid if self._worker else None

    @property
    def supervisor_pid(self) -> int | None:
        """Pid of the kernel's supervisor (the process that holds its limits), once it is ready."""
        return self._worker.supervisor_pid if self._worker else None

    @property
    def watchdog(self) -> Watchdog | RemoteDeadline | None:
        """What enforces the running worker's deadline (the provisioner's watchdog, or a gateway
        kernel's), or None before a worker started."""
        return self._worker.watchdog if self._worker else None

    async def run(self, code: str) -> RunResult:
        """Run ``code``; return its printed output, or the error dict."""
        async with self._lock:
            refused = gate_refusal(code, self._gate)  # before anything: denied code never starts a worker
            if refused is not None:
                return refused
            if self.approve is not None and not await self.approve(code):
                return error_result("", "refused: the person did not approve this code", "done_with_errors")
            try:
                worker = await self._ensure_started()
            except (WorkerBootstrapError, WorkerPoolExhaustedError, HostMemoryError) as exc:
                return error_result("", str(exc))
            worker.busy = True
            self._effects = None
            try:
                result = await self._execute(worker, code)
            finally:
                worker.busy = False
                worker.last_used = time.monotonic()
            recorder = self._history_recorder()
            if recorder is not None and recorder.changed():  # its copies recorded before the caller looks
                await off_loop(recorder.record)
            return with_effects(self._with_notes(result, worker), self._effects)

    async def _ensure_started(self) -> AnyWorker:
        worker = self._worker
        if worker is not None and worker.retired is None and await worker.is_alive():
            return worker
        if worker is not None:  # retired by the pool while idle: a fresh namespace is no error
            self._worker = None
            self._known_names = []
            await self._give_back(worker)
        self._worker = await self._pool.acquire()
        self._connect_asker(self._worker)
        return self._worker

    def _connect_asker(self, worker: AnyWorker) -> None:
        """This session's grants go to the worker's broker; questions the host has for it (e.g. an
        unknown host) go to ``ask``, on our loop."""
        if isinstance(worker, GatewayWorker):  # the gateway holds the grants; its questions come at the prompt
            worker.asker = self._remote_asker()
            return
        provisioner = worker.km.provisioner
        set_grants = getattr(provisioner, "set_broker_grants", None)
        if set_grants is not None:
            set_grants(frozenset(self.grants))
        broker = getattr(provisioner, "broker", None)
        if broker is not None and self.ask is None:
            broker.asker = None  # a pooled worker must not keep another session's asker
        if broker is None or self.ask is None:
            return
        loop, ask = asyncio.get_running_loop(), self.ask

        async def asking(question: str, choices: tuple[str, ...]) -> str:
            return str(await ask(question, choices))

        def bridge(question: str, choices: tuple[str, ...]) -> str:
            self._asking_since = time.monotonic()
            try:
                return asyncio.run_coroutine_threadsafe(asking(question, choices), loop).result()
            finally:  # the person's time does not count against the call's deadline
                self._asked_s += time.monotonic() - self._asking_since
                self._asking_since = None

        broker.asker = bridge

    def _remote_asker(self) -> Callable[[str, tuple[str, ...]], Awaitable[str]] | None:
        ask = self.ask
        if ask is None:
            return None

        async def asking(question: str, choices: tuple[str, ...]) -> str:
            self._asking_since = time.monotonic()
            try:
                return str(await ask(question, choices))
            finally:  # the person's time does not count against the call's deadline
                self._asked_s += time.monotonic() - self._asking_since
                self._asking_since = None

        return asking

    async def _execute(self, worker: AnyWorker, code: str) -> RunResult:
        kc = worker.kc
        msg_id = kc.execute(code, allow_stdin=False, stop_on_error=True, user_expressions={"names": _NAMES_EXPR})
        out = CellOutput()
        c = self.config
        if c.deadline_ms is None:  # no deadline: the call waits as long as the cell runs
            fallback = math.inf
        else:
            fallback = time.monotonic() + (c.deadline_ms + c.interrupt_grace_ms) / 1000 + _FALLBACK_SLACK_S
        self._asked_s = 0.0
        idle = False
        while not idle:
            asking = self._asking_since
            paused = self._asked_s + (time.monotonic() - asking if asking is not None else 0.0)
            if time.monotonic() >= fallback + paused:
                return await self._lose_worker(f"timeout: execution exceeded deadline_ms={c.deadline_ms}")
            try:
                msg = await kc.get_iopub_msg(timeout=_POLL_S)
            except queue.Empty:
                if not await worker.is_alive():
                    return await self._lose_worker(self._death_cause(worker))
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            idle = out.take(msg)
        reply = await self._shell_reply(worker, msg_id)
        if reply is None and not await worker.is_alive():  # it said idle, and was ended before replying
            return await self._lose_worker(self._death_cause(worker))
        watchdog = worker.watchdog
        if watchdog is not None and watchdog.interrupted(msg_id):
            # "Namespace preserved" only once the tree has gone quiet: a thread the cell left
            # spinning keeps the execution running, and the watchdog ends it after the grace.
            while not watchdog.settled(msg_id) and time.monotonic() < fallback:
                await asyncio.sleep(_POLL_S)
            if watchdog.phase_of(msg_id) is Phase.KILLED or not await worker.is_alive():
                return await self._lose_worker(self._death_cause(worker))
        content = reply["content"] if reply else {}
        self._effects = effects_in((reply or {}).get("metadata"))  # the kernel's own report
        if content.get("status") == "ok":
            self._known_names = _names_from(content.get("user_expressions", {}).get("names"))
        return self._result(worker, msg_id, out, content)

    def _result(self, worker: AnyWorker, msg_id: str, out: CellOutput, content: dict[str, Any]) -> RunResult:
        if worker.watchdog is not None and worker.watchdog.interrupted(msg_id):
            return error_result(out.text, names.INTERRUPTED_TEXT.format(deadline_ms=self.config.deadline_ms))
        if out.error is not None or content.get("status") == "error":
            error = out.error or f"{content.get('ename')}: {content.get('evalue')}"
            if is_refusal(error):  # the kernel's own check refused it before it ran
                return error_result(out.text, error, DONE_WITH_ERRORS)
            return error_result(out.text, error)
        if content.get("status") == "aborted":  # never ran: not an empty success
            return error_result(out.text, ABORTED_TEXT)
        return out.text

    def _with_notes(self, result: RunResult, worker: AnyWorker | None) -> RunResult:
        """Append the one-line notes a result carries: a memory soft-limit breach, a restart loop."""
        notes = [
            n
            for n in (worker.watchdog.take_soft_notice() if worker and worker.watchdog else None, self._restart_note)
            if n
        ]
        self._restart_note = None
        if not notes:
            return result
        text = "".join(f"{n}\n" for n in notes)
        if isinstance(result, str):
            return result + text
        result["result"] += text
        return result

    def _death_cause(self, worker: AnyWorker) -> str:
        """Why the worker is gone: the user's Esc, the watchdog's kill, or a crash."""
        if self._user_interrupt:
            return USER_INTERRUPT_CAUSE
        if worker.retired:
            return f"stopped: {worker.retired}"
        watchdog = worker.watchdog
        if watchdog is not None and watchdog.loss is not None:
            return f"{watchdog.loss.cause}; {watchdog.loss.observer}"
        observer = f"; {watchdog.observer.describe()}" if watchdog else ""
        status = worker.exit_status()
        if status == names.DEADLINE_EXIT_STATUS:  # the supervisor's backstop
            return f"timeout: execution exceeded deadline_ms={self.config.deadline_ms}{observer}"
        return f"crash: {_exit_description(status)}{observer}"

    async def _shell_reply(self, worker: AnyWorker, msg_id: str) -> dict[str, Any] | None:
        deadline = time.monotonic() + self.config.namespace_timeout_ms / 1000
        while time.monotonic() < deadline:
            try:
                reply: dict[str, Any] = await worker.kc.get_shell_msg(timeout=_POLL_S)
            except queue.Empty:
                if not await worker.is_alive():
                    return None
                continue
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply
        return None

    async def _lose_worker(self, cause: str) -> dict[str, str]:
        lost = list(self._known_names)
        self._known_names = []
        self._user_interrupt = False
        self._note_restart(cause)
        await self._release_worker()
        message = lost_names_message(cause, lost)
        return error_result(message, message)

    def _note_restart(self, cause: str) -> None:
        """From the third lost worker within 60 s, say so: something keeps killing it."""
        now = time.monotonic()
        self._restarts.append((now, cause))
        while self._restarts and now - self._restarts[0][0] > RESTART_WINDOW_S:
            self._restarts.popleft()
        if len(self._restarts) >= RESTART_WARNING_AT:
            self._restart_note = (
                f"[ivralo] this session's worker was lost {len(self._restarts)} times in the last "
                f"{RESTART_WINDOW_S:g} s; the last time: {cause}. Check the code for a loop that never "
                "ends or an allocation that grows, before retrying"
            )
            log.warning("ivralo: %s", self._restart_note)

    async def _give_back(self, worker: AnyWorker) -> None:
        if isinstance(worker, GatewayWorker):
            assert isinstance(self._pool, GatewayPool)
            await self._pool.release(worker)
        else:
            assert isinstance(self._pool, WorkerPool)
            await self._pool.release(worker)

    async def _release_worker(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            await self._give_back(worker)

    async def interrupt(self) -> dict[str, str] | None:
        """The Esc key: end the worker and its whole tree now (no grace). The next call gets a fresh
        worker. Returns the loss message listing the variables that were lost (None if no worker ran).

        A call in flight returns the same message. (JupyterLab's interrupt button stays a plain SIGINT.)
        """
        worker = self._worker
        if worker is None:
            return None
        self._user_interrupt = True
        lost = list(self._known_names)
        await worker.kill()
        message = lost_names_message(USER_INTERRUPT_CAUSE, lost)
        if not self._lock.locked():  # nothing in flight will clean up after us
            async with self._lock:
                await self._lose_worker(USER_INTERRUPT_CAUSE)
        return error_result(message, message)

    async def close(self) -> None:
        """Stop the worker and its whole process tree."""
        async with self._lock:
            await self._release_worker()
            if self._owns_pool:
                await self._pool.close()

    async def interpreter(self) -> str:
        """Which Python this session's kernels run, and why (kernel_info says it too, once one started)."""
        return (await self._pool.interpreter()).description

    async def run_tests(self, path: str = ".", runner: str | None = None, args: tuple[str, ...] = ()) -> dict[str, Any]:
        """Run the tests at ``path`` (relative to the workspace) in a fresh kernel of ``runner``'s surface
        (None: this session's): "project" runs pytest in the project's interpreter (``args`` go to it),
        "hermetic" runs them with the standard library only (see ``host/test_runs.py``). Returns
        ``{"runner", "status", "passed", "failed", "errors", "skipped", "output"}``, and ``"error"`` when
        the run could not complete, or a hermetic run met a module off its surface. This session's own
        namespace is not touched."""
        runner = runner or self.surface
        if isinstance(self._pool, GatewayPool):
            raise ConfigError("run_tests", "the tests' files are on the gateway's machine", "Run them there")
        if runner not in RUNNERS:
            raise ConfigError("runner", f"{runner!r} is not one of {', '.join(RUNNERS)}", "Pick one of them")
        if self.approve is not None and not await self.approve(f"# run_tests({path!r}, runner={runner!r})"):
            return run_report(runner, error_result("", "refused: the person did not approve this test run"))
        # The code gate judges an agent's cells; the runner's cell is ivralo's own (the tests are files).
        changes: dict[str, Any] = {"surface": runner, "code_gate": False, "prewarm_pool_size": 0}
        if runner != self.surface:  # the hermetic surface has no project; a hermetic session had none
            changes["project"] = None
        pool = WorkerPool(self.workspace, config=self.config.replace(**changes), role=self.role)
        try:
            if runner == names.SURFACE_PROJECT:
                try:
                    launch = await self._pool.interpreter() if self.surface == runner else await pool.interpreter()
                except WorkerBootstrapError as exc:
                    return run_report(runner, error_result("", str(exc)))
                if "pytest" not in launch.found:
                    message = (
                        f"pytest is not installed in the project's interpreter, {launch.description}. Install it "
                        f"there: {launch.install_command('pytest')}"
                    )
                    return run_report(runner, error_result("", message))
                pool.settings = dataclasses.replace(pool.settings, launch=launch)
            async with Session(pool=pool, grants=self.grants, ask=self.ask) as tests:
                result = await tests.run(runner_cell(runner, path, tuple(args)))
        finally:
            await pool.close()
        return run_report(runner, result)

    async def list_vars(self) -> list[str]:
        """Names of the variables in the namespace now (no values)."""
        async with self._namespace("list_vars()") as call:
            found = (await call.request({"names": _NAMES_EXPR})).get("names")
            self._known_names = _names_from(found)
        return list(self._known_names)

    async def get_var(self, name: str, *, or_repr: bool = False) -> Any:
        """The value of ``name``: a JSON value, a numpy array, or a table (pandas DataFrame or Series,
        pyarrow Table or ChunkedArray) as Arrow carries it. Anything else is refused with its type's
        name (``UnsupportedValueError``), or, with ``or_repr=True``, returned as its repr, at most
        1000 characters. Nothing the kernel sends is unpickled."""
        _check_name(name)
        async with self._namespace(f"get_var({name!r})") as call:
            return await self._fetch(call, name, tables_only=False, or_repr=or_repr)

    async def get_dataframe(self, name: str) -> Any:
        """The table ``name`` over Arrow IPC in shared memory: a pandas DataFrame (or Series) comes
        back as one, a pyarrow Table as one. Needs pyarrow (``pip install 'ivralo-kernel[arrow]'``)."""
        _check_name(name)
        require_arrow(f"get_dataframe({name!r})")
        async with self._namespace(f"get_dataframe({name!r})") as call:
            return await self._fetch(call, name, tables_only=True, or_repr=False)

    async def _fetch(self, call: NamespaceCall, name: str, *, tables_only: bool, or_repr: bool) -> Any:
        asked = f"{DATAPLANE}.prepare({name!r}, {tables_only}, {or_repr})"
        envelope = json.loads(await call.value(asked))
        if not isinstance(envelope, dict) or envelope.get("kind") not in ("json", "repr", "arrow", "npy"):
            raise TransferRefusedError(f"{call.operation}: the kernel's answer is not one of its data plane's")
        if envelope["kind"] in ("json", "repr"):
            return decode_inline(envelope)
        if envelope["kind"] == "arrow":
            require_arrow(call.operation)
        cap, why = self._transfer_cap()
        if isinstance(call.worker, GatewayWorker):  # no shared memory: binary buffers on the websocket
            return await fetch_remote(call, envelope, cap, why)
        exchange = self._exchange(call.worker)
        path, capacity = exchange.reserve(checked_size(call.operation, envelope, "size", cap, why))
        try:
            written = json.loads(await call.value(f"{DATAPLANE}.write({path!r}, {capacity})"))
            length = checked_size(call.operation, written, "size", capacity, "the segment the host reserved")
            data = await off_loop(exchange.read, length)
            return await off_loop(decode_segment, envelope, data, length)
        except BaseException:
            exchange.discard()  # a late answer may still write: into a segment nobody reads again
            raise
        finally:
            exchange.settle()

    def _transfer_cap(self) -> tuple[int, str]:
        """(the most bytes one transfer from the kernel may take, where that number comes from)."""
        c = self.config
        cap = transfer_cap(c.transfer_cap_bytes, c.memory_limit_bytes)
        why = "transfer_cap_bytes" if c.transfer_cap_bytes is not None else "the kernel's memory limit"
        spare = available_memory() - c.host_memory_reserve_bytes
        if spare < cap:
            reserve = c.host_memory_reserve_bytes
            return max(0, spare), f"what the host has available less host_memory_reserve_bytes={reserve}"
        return cap, why

    async def set_var(self, name: str, value: Any) -> None:
        """Bind ``name`` in the namespace to a JSON-serialisable ``value``."""
        _check_name(name)
        # An import statement, not __import__: the hermetic surface and the code gate refuse that builtin.
        code = f"import json as _ivralo_json\n{name} = _ivralo_json.loads({json.dumps(value)!r})\ndel _ivralo_json"
        async with self._namespace(f"set_var({name!r})") as call:
            await call.request({}, code)
            self._known_names = sorted({*self._known_names, name})

    async def snapshot(self) -> dict[str, dict[str, Any]]:
        """Each variable's ``type``, ``shape`` (arrays, frames) or ``len`` (str, bytes, list, tuple,
        dict, set) and ``bytes`` (shallow): never a value."""
        async with self._namespace("snapshot()") as call:
            described = json.loads(await call.value(f"{DATAPLANE}.describe()"))
        return {str(k): v for k, v in sorted(described.items())}

    async def apropos(self, word: str) -> str:
        """What the worker's surface offers matching ``word`` (``%apropos``): ivralo's helpers, the
        brokered operations and databases (and whether this session is granted each), the hosts code
        may reach, the modules it can import. Asked of the surface itself, never assumed."""
        return await self._text_of("apropos", word)

    async def doc(self, name: str) -> str:
        """What ``name`` is on the worker's surface (``%doc``)."""
        return await self._text_of("doc", name)

    async def _text_of(self, helper: str, argument: str) -> str:
        async with self._namespace(f"{helper}({argument!r})") as call:
            return await call.value(f"ivralo.{helper}({argument!r})")

    async def reset(self) -> None:
        """Empty the namespace; the worker keeps running."""
        # As an expression (evaluated, not run as a cell): the code gate refuses get_ipython in a cell.
        async with self._namespace("reset()") as call:
            await call.request({"reset": "get_ipython().reset(new_session=False)"})
            self._known_names = []

    async def inject_dataframe(self, name: str, frame: Any) -> None:
        """Bind ``name`` to a copy of a pandas DataFrame or a pyarrow Table, sent as Arrow IPC through
        shared memory. A column Arrow cannot carry is refused, naming it and its dtype (no pickle).
        Needs pyarrow (``pip install 'ivralo-kernel[arrow]'``)."""
        _check_name(name)
        operation = f"inject_dataframe({name!r})"
        require_arrow(operation)
        table, kind = as_table(frame)
        size = ipc_size(table)
        async with self._namespace(operation) as call:
            if isinstance(call.worker, GatewayWorker):  # no shared memory: binary buffers on the websocket
                await inject_remote(call, name, table, kind)
                self._known_names = sorted({*self._known_names, name})
                return
            exchange = self._exchange(call.worker)
            path, capacity = exchange.reserve(size)
            try:
                length = await off_loop(exchange.write_table, table)
                await call.value(f"{DATAPLANE}.receive({name!r}, {path!r}, {capacity}, {length}, {kind!r})")
            except BaseException:
                exchange.discard()
                raise
            finally:
                exchange.settle()
            self._known_names = sorted({*self._known_names, name})

    async def history(self, path: str | None = None) -> list[dict[str, Any]]:
        """The workspace's kept copies (the write guard's, before a cell changed a file), newest first:
        ``{"id", "time", "path", "operation", "size", "copy"}``; only those of ``path`` (a file, or the
        files under a folder; relative to the workspace) if given. Read by the host: the kernel never can."""
        store = HistoryStore(self.workspace, self.config.tool_files)

        def listed() -> list[dict[str, Any]]:
            self._record_history()
            return [entry_dict(store, e) for e in store.listing(path, base=store.workspace)]

        return await off_loop(listed)

    async def restore(self, target: str, *, at: str | None = None, force: bool = False) -> dict[str, Any]:
        """Put a kept copy back, byte for byte: ``target`` is its ID, or with ``at`` (a time) a file's
        path, restored as it was then. Refused over a newer change unless ``force``; what it overwrites
        is kept as a copy first. Returns ``{"restored", "path", "size", "kept", "unchanged",
        "created_folders", "message"}``; raises ``HistoryError`` (``NewerChangeError`` for a refusal)."""
        if self.role == names.ROLE_READONLY:
            raise HistoryError(
                "this session's role is readonly, so it changes no files, restores included. Ask the person to "
                "restore it: ivralo-kernel history restore ID"
            )
        store = HistoryStore(self.workspace, self.config.tool_files)

        def restored() -> dict[str, Any]:
            self._record_history()
            if at is not None:
                entry = store.at(target, parse_time(at), base=store.workspace)
            else:
                entry = store.find(target)
            return store.restore(entry, force=force, force_flag="force=True").as_dict()

        return await off_loop(restored)

    def _history_recorder(self) -> HistoryRecorder | None:
        """The host's recorder of the worker's history (its provisioner's), if it has one here."""
        provisioner = getattr(getattr(self._worker, "km", None), "provisioner", None)
        recorder = getattr(provisioner, "history_recorder", None)
        return recorder if isinstance(recorder, HistoryRecorder) else None

    def _record_history(self) -> None:
        """What the worker's write guard copied, recorded now by its host (its provisioner's recorder
        also does, on a thread of its own, when a cell ends)."""
        recorder = self._history_recorder()
        if recorder is not None:
            recorder.record()

    def _exchange(self, worker: Worker) -> Exchange:
        if worker.exchange is None:
            folder = getattr(worker.km.provisioner, "exchange_dir", None)
            if not folder:
                raise RuntimeError("this worker's provisioner made no exchange folder: tables cannot be sent")
            worker.exchange = Exchange(folder)
        return worker.exchange

    @contextlib.asynccontextmanager
    async def _namespace(self, operation: str) -> AsyncIterator[NamespaceCall]:
        """One namespace operation, alone on the worker, bounded by ``namespace_timeout_ms`` (not lethal)."""
        async with self._lock:
            worker = await self._ensure_started()
            try:
                yield NamespaceCall(worker, operation, self.config.namespace_timeout_ms)
            except WorkerGone:
                pid = worker.pid
                lost = await self._lose_worker(self._death_cause(worker))
                raise NamespaceWorkerLostError(
                    f"{operation}: the worker pid={pid} ended during this call; {lost['error']}"
                ) from None


def _check_gateway(pool: WorkerPool | None, grants: tuple[str, ...], python: str | None, project: Any) -> None:
    """What a session behind a gateway cannot take: the gateway's machine decides these."""
    given = [n for n, v in (("pool", pool), ("grants", grants), ("python", python), ("project", project)) if v]
    if given:
        raise ConfigError(
            ", ".join(given),
            "with gateway_url the kernel runs on the gateway's machine, whose configuration holds the grants, "
            "the credentials and the interpreter",
            "Set them in the gateway's jupyter_ivralo_config (IvraloProvisioner.grants, ...), and leave them out here",
        )


def _check_name(name: str) -> None:
    if not name.isidentifier():
        raise ValueError(f"{name!r} is not a Python variable name")


def _exit_description(code: int | None) -> str:
    if code is None:
        return "the kernel stopped answering"
    return f"the kernel {describe_exit(code)}"


def _names_from(expression_result: dict[str, Any] | None) -> list[str]:
    if not expression_result or expression_result.get("status") != "ok":
        return []
    try:
        value = ast.literal_eval(expression_result["data"]["text/plain"])
    except (KeyError, ValueError, SyntaxError):
        return []
    return [str(v) for v in value]


class SyncSession:
    """The same session for scripts: every method and property of ``Session``, each call blocking
    until it is done (``with SyncSession(workspace) as s: s.run(code)``). Its parameters are
    ``Session``'s. It runs its own event loop on a thread (tests/test_host_api.py keeps the two in step).
    """

    def __init__(
        self,
        workspace: str | os.PathLike[str] | None = None,
        *,
        config: WorkerConfig | None = None,
        role: str | None = None,
        grants: tuple[str, ...] = (),
        ask: Callable[[str, tuple[str, ...]], Awaitable[str]] | None = None,
        approve: Callable[[str], Awaitable[bool]] | None = None,
        surface: str | None = None,
        gateway_url: str | None = None,
        python: str | None = None,
        project: str | os.PathLike[str] | None = None,
        pool: WorkerPool | None = None,
    ) -> None:
        self._loop = LoopThread("ivralo-session")
        given: dict[str, Any] = dict(config=config, role=role, grants=grants, ask=ask, approve=approve)
        given.update(surface=surface)
        given.update(gateway_url=gateway_url, python=python, project=project, pool=pool)
        self._session: Session = self._call(_make_session(workspace, **given))

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.call(coro)

    def __enter__(self) -> SyncSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def connect(connection_file: str, timeout_s: float | None = None) -> SyncAttachedSession:
        """``Session.connect``, blocking: ``with SyncSession.connect(path) as s: s.run(code)``."""
        from ivralo_kernel.host.attach import SyncAttachedSession

        return SyncAttachedSession(connection_file, timeout_s)

    @property
    def workspace(self) -> str:
        """The folder the kernel works in (absolute)."""
        return self._session.workspace

    @property
    def config(self) -> WorkerConfig:
        """The settings the session's kernels run with."""
        return self._session.config

    @property
    def role(self) -> str:
        """The role the session's kernels run as (what they may do)."""
        return self._session.role

    @property
    def grants(self) -> tuple[str, ...]:
        """The brokered operations' grants given to this session."""
        return self._session.grants

    @property
    def ask(self) -> Callable[[str, tuple[str, ...]], Awaitable[str]] | None:
        """The callback that answers the egress question, or None."""
        return self._session.ask

    @property
    def approve(self) -> Callable[[str], Awaitable[bool]] | None:
        """The callback that approves each cell before it runs, or None."""
        return self._session.approve

    @property
    def surface(self) -> str:
        """The surface the session's kernels offer ("project" or "hermetic")."""
        return str(self._session.surface)

    @property
    def gateway_url(self) -> str | None:
        """The Kernel Gateway the kernels run on, or None (on this machine)."""
        return self._session.gateway_url

    @property
    def kernel_info(self) -> dict[str, Any]:
        """``Session.kernel_info``."""
        return self._session.kernel_info

    @property
    def pid(self) -> int | None:
        """``Session.pid``."""
        return self._session.pid

    @property
    def supervisor_pid(self) -> int | None:
        """``Session.supervisor_pid``."""
        return self._session.supervisor_pid

    @property
    def watchdog(self) -> Watchdog | RemoteDeadline | None:
        """``Session.watchdog``."""
        return self._session.watchdog

    def run(self, code: str) -> RunResult:
        """``Session.run``, blocking."""
        return self._call(self._session.run(code))

    def run_tests(self, path: str = ".", runner: str | None = None, args: tuple[str, ...] = ()) -> dict[str, Any]:
        """``Session.run_tests``, blocking."""
        return self._call(self._session.run_tests(path, runner, args))

    def interpreter(self) -> str:
        """``Session.interpreter``, blocking."""
        return self._call(self._session.interpreter())

    def list_vars(self) -> list[str]:
        """``Session.list_vars``, blocking."""
        return self._call(self._session.list_vars())

    def get_var(self, name: str, *, or_repr: bool = False) -> Any:
        """``Session.get_var``, blocking."""
        return self._call(self._session.get_var(name, or_repr=or_repr))

    def get_dataframe(self, name: str) -> Any:
        """``Session.get_dataframe``, blocking."""
        return self._call(self._session.get_dataframe(name))

    def inject_dataframe(self, name: str, frame: Any) -> None:
        """``Session.inject_dataframe``, blocking."""
        self._call(self._session.inject_dataframe(name, frame))

    def set_var(self, name: str, value: Any) -> None:
        """``Session.set_var``, blocking."""
        self._call(self._session.set_var(name, value))

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """``Session.snapshot``, blocking."""
        return self._call(self._session.snapshot())

    def apropos(self, word: str) -> str:
        """``Session.apropos``, blocking."""
        return self._call(self._session.apropos(word))

    def doc(self, name: str) -> str:
        """``Session.doc``, blocking."""
        return self._call(self._session.doc(name))

    def reset(self) -> None:
        """``Session.reset``, blocking."""
        self._call(self._session.reset())

    def interrupt(self) -> dict[str, str] | None:
        """``Session.interrupt``, blocking."""
        return self._call(self._session.interrupt())

    def history(self, path: str | None = None) -> list[dict[str, Any]]:
        """``Session.history``, blocking."""
        return self._call(self._session.history(path))

    def restore(self, target: str, *, at: str | None = None, force: bool = False) -> dict[str, Any]:
        """``Session.restore``, blocking."""
        return self._call(self._session.restore(target, at=at, force=force))

    def close(self) -> None:
        """``Session.close``, blocking; then the session's own loop ends. Calling it again does nothing."""
        if self._loop.stopped:
            return
        self._call(self._session.close())
        self._loop.stop()


async def _make_session(workspace: str | os.PathLike[str] | None, **kwargs: Any) -> Session:
    return Session(workspace, **kwargs)  # built inside the loop thread: its lock binds to that loop
