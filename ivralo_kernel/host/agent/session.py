"""[host] ``Session``: one agent's Python worker, reached over jupyter_client.

* Lazy: the kernel starts on the first call, not in the constructor.
* One call at a time: calls of one session are serialised by a lock, so two never share a worker.
* The return contract: ``run`` returns what the cell printed (and its result's text) as ``str``, or
  ``{"status", "result", "error"}`` when the cell failed or the worker was lost.
* Names, never values: after each successful call the host keeps the list of variable names, so a
  lost worker can say which variables have to be recreated.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ivralo_kernel.host.agent.code_gate import gate_refusal
from ivralo_kernel.host.agent.dataplane import (
    TransferRefusedError,
    as_table,
    ipc_size,
    kernel_json,
    require_arrow,
)
from ivralo_kernel.host.agent.gateway.worker import GatewayPool
from ivralo_kernel.host.agent.kernel_worker import DeadlineView
from ivralo_kernel.host.agent.namespace import (
    DATAPLANE,
    NamespaceTimeoutError,
    NamespaceWorkerLostError,
)
from ivralo_kernel.host.agent.outputs import assigned_names, error_result, lost_names_message, with_effects
from ivralo_kernel.host.agent.pool import HostMemoryError, WorkerPool, WorkerPoolExhaustedError
from ivralo_kernel.host.agent.session_calls import (
    _NAMES_EXPR,
    USER_INTERRUPT_CAUSE,
    USER_RESTART_CAUSE,
    AnyWorker,
    RunResult,
    SessionCalls,
    _names_from,
)
from ivralo_kernel.host.agent.test_runs import RUNNERS, run_report, runner_cell
from ivralo_kernel.host.history.store import HistoryError, HistoryStore, entry_dict, parse_time
from ivralo_kernel.host.off_loop import off_loop
from ivralo_kernel.host.settings.config import WorkerConfig
from ivralo_kernel.protocol import ConfigError, WorkerBootstrapError, names
from ivralo_kernel.protocol.messages import Effects

if TYPE_CHECKING:
    from ivralo_kernel.host.agent.attach import AttachedSession

__all__ = ["NamespaceTimeoutError", "NamespaceWorkerLostError", "RunResult", "Session"]
T = TypeVar("T")


class Session(SessionCalls):
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
        if project is not None:  # the project surface's interpreter (host/jupyter/interpreters.py)
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
        self._running_code: str | None = None
        self._user_stop: str | None = None
        self._restarts: deque[tuple[float, str]] = deque()
        self._restart_note: str | None = None
        self._asked_s = 0.0  # time spent waiting for answers to ``ask`` during the running call
        self._effects: Effects | None = None  # what the last run's execution did (the kernel's word)
        self._images: tuple[str, ...] = ()  # the last run's PNG display data
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
        from ivralo_kernel.host.agent.attach import AttachedSession

        return AttachedSession(connection_file, timeout_s)

    @property
    def kernel_info(self) -> dict[str, Any]:
        """The kernel's ``kernel_info_reply`` content (its ``ivralo`` section: layers, interpreter), once
        a worker started; else empty."""
        return self._worker.kernel_info if self._worker else {}

    @property
    def memory_cgroup_report(self) -> str:
        """Which memory limit the Linux kernel enforces on this kernel's tree, or why none (doctor)."""
        provisioner = getattr(getattr(self._worker, "km", None), "provisioner", None)
        return str(getattr(provisioner, "cgroup_report", ""))

    @property
    def pid(self) -> int | None:
        """Pid of the kernel process (not the supervisor), once it is ready."""
        return self._worker.pid if self._worker else None

    @property
    def supervisor_pid(self) -> int | None:
        """Pid of the kernel's supervisor (the process that holds its limits), once it is ready."""
        return self._worker.supervisor_pid if self._worker else None

    @property
    def watchdog(self) -> DeadlineView | None:
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
            self._images = ()
            self._running_code = code
            try:
                result = await self._execute(worker, code)
            finally:
                self._running_code = None
                worker.busy = False
                worker.last_used = time.monotonic()
            recorder = self._history_recorder()
            if recorder is not None and recorder.changed():  # its copies recorded before the caller looks
                await off_loop(recorder.record)
            return with_effects(self._with_notes(result, worker), self._effects, self._images)

    async def interrupt(self) -> dict[str, str] | None:
        """The Esc key: end the worker and its whole tree now (no grace). The next call gets a fresh
        worker. Returns the loss message listing the variables that were lost (None if no worker ran).

        A call in flight returns the same message, as its ``error`` (its ``result``: what it printed
        before). (JupyterLab's interrupt button stays a plain SIGINT.)
        """
        worker = self._worker
        if worker is None:
            return None
        self._user_stop = USER_INTERRUPT_CAUSE
        lost = list(self._known_names)
        running = self._running_code
        await worker.kill()
        message = lost_names_message(USER_INTERRUPT_CAUSE, lost, assigned_names(running or ""))
        if not self._lock.locked():  # nothing in flight will clean up after us
            async with self._lock:
                # Unless a call that ended during the kill has (its loss is counted once, not twice).
                if self._worker is worker:
                    await self._lose_worker(USER_INTERRUPT_CAUSE)
        return error_result("", message)

    async def restart(self) -> dict[str, str] | None:
        """End the worker and its whole tree now (as ``interrupt`` does), then start a fresh one with the
        same workspace, config, role and grants; returns once it is ready. Returns the loss message
        listing the variables that were lost, as a lost worker's is (None if no worker ran: one is
        started all the same). A call in flight returns the same message. Files on disk stay.

        If the fresh worker cannot start, its error is raised (``WorkerBootstrapError``, ...): the old
        one has ended all the same, and the next call tries to start one again."""
        lost, ended = list(self._known_names), self._worker is not None
        running, code = self._worker, self._running_code
        if running is not None and self._lock.locked():  # a call in flight: it ends now, with the loss
            self._user_stop = USER_RESTART_CAUSE
            await running.kill()
        async with self._lock:
            self._user_stop = None
            if self._worker is not None:  # nothing in flight ended it (or a call started one meanwhile)
                lost, ended = list(self._known_names), True
                await self._worker.kill()  # the whole tree, now: no grace, as the Esc key
                self._known_names = []
                await self._release_worker()
            await self._ensure_started()
        if not ended:
            return None
        message = lost_names_message(USER_RESTART_CAUSE, lost, assigned_names(code or ""))
        return error_result("", message)

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
        "hermetic" runs them with the standard library only (see ``host/agent/test_runs.py``). Returns
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
            described = kernel_json("snapshot()", await call.value(f"{DATAPLANE}.describe()"))
        if not isinstance(described, dict):
            raise TransferRefusedError("snapshot(): the kernel's answer is not a table of its variables")
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
        self._pool.note_tables()  # the pool's next spares import what tables need while they wait
        async with self._namespace(operation) as call:
            await call.worker.inject(call, name, table, kind, size)  # shared memory, or the gateway's websocket
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
