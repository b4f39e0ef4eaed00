"""[kernel] ``IvraloKernel``: IPython's kernel with one thread for user code and an ``ivralo`` report.

* User code runs only on the main thread, where SIGINT reaches it: ``execute_request`` on the
  control channel is answered with an error (ipykernel would run it on the Control thread), and
  subshells are neither advertised nor created (their cells cannot be interrupted).
* ``kernel_info_reply`` carries an ``ivralo`` section: version, pid, bootstrap time, workspace,
  role, and which protection layers are in force. Hosts treat a worker as ready only once it is
  there.
* The host's watchdog talks to the kernel over control (served while a cell runs): a deadline
  notice before it interrupts, and "which execution is running?" before it kills. Their IOPub
  busy/idle is not published, so a frontend never shows the kernel idle in the middle of a cell.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import time
from typing import Any

from ipykernel.ipkernel import IPythonKernel
from traitlets import Type, default

import ivralo_kernel.guards as guards_package
import ivralo_kernel.kernel.api as api  # the submodules, not this package's namespace (which loads this module)
import ivralo_kernel.kernel.dataplane as dataplane
import ivralo_kernel.kernel.sandbox.own_ports as own_ports
import ivralo_kernel.kernel.surface_magics as surface_magics
import ivralo_kernel.kernel.uv_magic as uv_magic
from ivralo_kernel import __version__, compat
from ivralo_kernel.guards.network import hosts_tried_line
from ivralo_kernel.kernel.broker_client import BROKER, HOST_CONNECT_TIMEOUT_S
from ivralo_kernel.kernel.cell_checks import install_cell_checks, make_hermetic
from ivralo_kernel.kernel.deadline import DeadlineNotices, InKernelWatchdog, SupervisorBackstop, interrupt_cell
from ivralo_kernel.kernel.effects import EffectsRecorder
from ivralo_kernel.kernel.error_hints import private_tmp_hint
from ivralo_kernel.kernel.interrupts import InterruptWindow
from ivralo_kernel.kernel.launch_state import STATE
from ivralo_kernel.kernel.pip_magic import guarded_pip
from ivralo_kernel.kernel.shell_pip import shell_pip_check
from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.errors import SecurityError
from ivralo_kernel.protocol.iopub_topics import kernel_ident
from ivralo_kernel.protocol.messages import CallRecord, Effects

# Which Python this is and why the host chose it (read before any cell could change the variable).
_INTERPRETER = {
    "python": sys.executable,
    "version": ".".join(map(str, sys.version_info[:3])),
    "choice": os.environ.get(names.ENV_INTERPRETER) or "the kernelspec's interpreter",
    "private_path": [p for p in os.environ.get(names.ENV_CODE_PATH, "").split(os.pathsep) if p],
}

CONTROL_EXECUTE_REFUSED = (
    "execute_request on the control channel is refused: ivralo runs code only on the shell "
    "channel, on the one thread where interrupts and deadlines reach it. Send it on shell."
)
# How long the kernel may take to leave after its shutdown_reply. ipykernel's own exit sometimes waits
# for ever (seen in about 1 of 10 raw launches: the main thread blocked in a join while two threads
# read the captured output pipes), and then nothing ends it: VS Code and the person's terminal wait
# on the process. A normal exit takes about 0.1 s here.
SHUTDOWN_EXIT_GRACE_S = 3.0

SUBSHELLS_REFUSED = (
    "subshells are not supported by the ivralo kernel: code in a subshell cannot be interrupted "
    "or held to a deadline. Send the request without a subshell_id."
)


class IvraloKernel(compat.KernelOverrides, IPythonKernel):
    """ipykernel's private methods it overrides are in ``compat.KernelOverrides``, which calls
    ``publish_own_status`` here; SIGINT's cancelling of awaiting cells is fixed there too."""

    implementation = names.IMPLEMENTATION
    implementation_version = __version__
    control_msg_types = [*IPythonKernel.control_msg_types, *names.CONTROL_MSG_TYPES]  # noqa: RUF012 - ipykernel API
    msg_types = [*IPythonKernel.msg_types, names.MSG_DATA_CHUNK]  # noqa: RUF012 - ipykernel API
    # debugpy is imported at the first debug_request, not at every start (50 ms of CPU).
    debugger_class = Type(compat.defer_debugger_import(own_ports.debugger_built))

    @default("ident")
    def _default_ident(self) -> str:
        """The ``<ident>`` of this kernel's IOPub topics, from the connection's key: the host's watchdog
        subscribes to ``kernel.<ident>.status`` alone (protocol/iopub_topics.py)."""
        return kernel_ident(self.session.key if self.session is not None else b"")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Same message type, different channel: only the control route changes.
        compat.route_control(self, "execute_request", self._refuse_control_execute)
        compat.route_control(self, "create_subshell_request", self._refuse_subshell)
        self.deadline_notices = DeadlineNotices()
        self._executing: str | None = None
        assert self.shell is not None
        # IPython keeps one custom-exception hook: the deadline's message, and refusals shown
        # without ivralo's own frames (OSError: the guards' refusals are PermissionError, gaierror).
        self.shell.set_custom_exc((KeyboardInterrupt, OSError, ImportError), _show_exception)
        # SIGINT raises only in the cell's own code: one during the reply would lose it (interrupts.py).
        self.interrupts = InterruptWindow()
        compat.wrap_run_code(self.shell, self.interrupts.enter_code, self.interrupts.leave_code)
        self._replacement_gate = _ReplacementGate() if os.environ.pop(names.ENV_REPLACEMENT, "") else None
        self._host_gate = BROKER.comm_id is not None  # a host started us: wait for its hello first
        BROKER.parent_of = self._running_request_id
        original_pip = self.shell.find_line_magic("pip")
        if original_pip is not None and STATE.workspace:
            workspace = STATE.workspace
            through_uv = uv_magic.through_uv(original_pip, self.shell)  # a uv project's .venv has no pip
            pip = guarded_pip(through_uv, workspace, instead=uv_magic.terminal_command)
            self.shell.register_magic_function(pip, "line", "pip")
            original_uv = self.shell.find_line_magic("uv")
            uv = uv_magic.uv_magic(
                original_uv, lambda run: guarded_pip(run, workspace, "%uv pip", uv_magic.uv_pip_command), self.shell
            )
            self.shell.register_magic_function(uv, "line", "uv")
        if STATE.workspace:  # and !pip, !python -m pip, !uv pip: the same sentence, before they run
            compat.check_shell_commands(self.shell, shell_pip_check(STATE.workspace))
        surface_magics.register(
            self.shell, {name: getattr(api, name) for name in api.__all__}
        )  # %apropos WORD, %doc NAME
        # The broker's API, ready in every cell as `ivralo` (help(ivralo)); hidden from %who and
        # the namespace API, like IPython's own names.
        self.shell.push({"ivralo": api, names.DATAPLANE_NAME: dataplane}, interactive=False)
        # And importable as `ivralo` (the hermetic surface's one helper module), on every surface, so
        # code written for the hermetic surface runs unchanged on the project one.
        sys.modules.setdefault("ivralo", api)
        # Checked on each cell's AST before it runs: the hermetic surface's builtins, the code gate.
        hermetic = STATE.policy is not None and STATE.policy.surface == names.SURFACE_HERMETIC
        gate = STATE.policy.code_gate if STATE.policy is not None else None
        self.cell_checks = install_cell_checks(self.shell, hermetic, gate)
        self.hermetic_imports = make_hermetic(self.shell) if hermetic else None
        self._effects: EffectsRecorder | None = None
        self._last_effects: Effects | None = None
        if STATE.workspace:
            self._effects = EffectsRecorder(STATE.workspace)
            self._effects.start()  # the workspace's watches are added in a thread, off the way to ready
        policy = STATE.policy
        self._backstop: SupervisorBackstop | None = None
        self._watchdog: InKernelWatchdog | None = None
        if policy and policy.deadline_ms and STATE.pipe is not None and STATE.pipe.connected:
            self._backstop = SupervisorBackstop(
                policy.deadline_ms, policy.interrupt_grace_ms, STATE.pipe, host_enforces=policy.host_enforces_deadline
            )
            BROKER.on_wait = (self._backstop.pause, self._backstop.resume)
            if not policy.host_enforces_deadline:
                self._watchdog = InKernelWatchdog(policy.deadline_ms, self.deadline_notices)

    # -- what the kernel says about itself -------------------------------------------------
    @property
    def banner(self) -> str:  # type: ignore[override]
        lines = [super().banner.rstrip("\n"), f"ivralo-kernel {__version__}: guarded session in {STATE.workspace}"]
        lines += [f"ivralo: {note}" for note in STATE.notes]
        return "\n".join(lines) + "\n"

    @property
    def kernel_info(self) -> dict[str, Any]:  # type: ignore[override]
        info: dict[str, Any] = dict(super().kernel_info)
        info["supported_features"] = [f for f in info.get("supported_features", []) if f != "kernel subshells"]
        info[names.KERNEL_INFO_SECTION] = {
            "version": __version__,
            "pid": os.getpid(),
            "bootstrap_ms": STATE.bootstrap_ms,
            "workspace": STATE.workspace,
            "role": STATE.role,
            "surface": STATE.policy.surface if STATE.policy is not None else names.SURFACE_PROJECT,
            "interpreter": _INTERPRETER,
            "layers": dict(STATE.layers),
            "scrubbed": list(STATE.scrubbed),
            "notes": list(STATE.notes),  # as the banner shows them
        }
        return info

    async def should_handle(self, stream: Any, msg: Any, idents: Any) -> bool:  # type: ignore[override]
        """(shell requests only) Hold the first requests until the host hears us."""
        if self._replacement_gate is not None:
            await self._replacement_gate.wait()
            self._replacement_gate = None
        if self._host_gate:
            await self._wait_for_host()
        return bool(super().should_handle(stream, msg, idents))

    async def _wait_for_host(self) -> None:
        """A kernel started by an ivralo host serves no shell request before the host's hello: its
        watchdog must see every execution start (the deadline, the broker's binding of a request to
        a running execution), and a client that connects first could otherwise run a cell before the
        host's IOPub subscription is live. Bounded: past it, requests go on and brokered calls fail
        saying the host did not connect."""
        # Woken by the control thread's hello, not by polling: a start spent most of its wait here
        # waking every 5 ms (CPU that 16 kernels starting together on 2 cores take from each other).
        loop = asyncio.get_running_loop()
        arrived = asyncio.Event()

        def wake() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the kernel is going away
                loop.call_soon_threadsafe(arrived.set)

        BROKER.when_host_ready(wake)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(arrived.wait(), HOST_CONNECT_TIMEOUT_S)
        self._host_gate = False

    def do_shutdown(self, restart: bool) -> dict[str, Any]:  # type: ignore[override]  # IPythonKernel's is sync
        """ipykernel's, with an exit that cannot hang: the reply goes out, and a process still here
        ``SHUTDOWN_EXIT_GRACE_S`` later leaves at once (a daemon timer: it keeps nothing alive). Only
        in a kernel process ivralo's launcher started: an in-process kernel's process is its host's."""
        if STATE.policy is not None:
            timer = threading.Timer(SHUTDOWN_EXIT_GRACE_S, os._exit, args=(0,))
            timer.daemon = True
            timer.start()
        return dict(super().do_shutdown(restart))

    # -- execution -------------------------------------------------------------------------
    async def execute_request(self, stream: Any, ident: Any, parent: Any) -> None:  # type: ignore[override]
        """ipykernel's, with SIGINT held until the cell's code runs and dropped after it (interrupts.py):
        from the request's arrival to its reply, not only in ``do_execute``."""
        self.interrupts.begin_execution()
        try:
            await super().execute_request(stream, ident, parent)
        finally:
            self.interrupts.end_execution()

    async def do_execute(  # type: ignore[override]
        self,
        code: str,
        silent: bool,
        store_history: bool = True,
        user_expressions: dict[str, Any] | None = None,
        allow_stdin: bool = False,
        *,
        cell_meta: dict[str, Any] | None = None,
        cell_id: str | None = None,
    ) -> dict[str, Any]:
        parent = self.get_parent("shell")
        msg_id = parent.get("header", {}).get("msg_id")
        self._executing = msg_id
        if STATE.network is not None:
            STATE.network.take_attempts()  # each cell lists only the hosts it tried
        BROKER.take_records()
        self._begin_effects()
        if self._backstop is not None:
            due = self._backstop.started(msg_id or "")
            if self._watchdog is not None and msg_id:
                self._watchdog.started(msg_id, due)
        try:
            reply: dict[str, Any] = await super().do_execute(
                code, silent, store_history, user_expressions, allow_stdin, cell_meta=cell_meta, cell_id=cell_id
            )
            # After the cell's output, in it: the stored run (a saved notebook) keeps these lines.
            records = BROKER.take_records()
            if records and not silent:
                print(api.record_line(records), flush=True)
            attempts = STATE.network.take_attempts() if STATE.network is not None else {}
            if attempts and not silent:
                print(hosts_tried_line(attempts), flush=True)
            self._end_effects(attempts, records)
            return reply
        finally:
            if self._watchdog is not None:
                self._watchdog.finished()
            if self._backstop is not None:
                self._backstop.finished()
            self._executing = None
            self.deadline_notices.discard(msg_id)

    def _begin_effects(self) -> None:
        self._last_effects = None
        if STATE.files is not None:
            STATE.files.take_started()
            STATE.files.history.take_taken()
        if self._effects is not None:
            self._effects.begin()

    def _end_effects(self, hosts: dict[str, str], calls: list[CallRecord]) -> None:
        if self._effects is None:
            return
        started, taken = (STATE.files.take_started(), STATE.files.history.take_taken()) if STATE.files else ([], {})
        workspace = STATE.workspace.rstrip(os.sep) + os.sep
        history = {path.removeprefix(workspace): copy for path, copy in taken.items()}
        self._last_effects = self._effects.end(hosts, calls, started, history)

    def finish_metadata(self, parent: dict[str, Any], metadata: dict[str, Any], reply_content: dict[str, Any]) -> Any:
        """The execute_reply's metadata: ipykernel's, and what the execution did (``ivralo.effects``)."""
        metadata = super().finish_metadata(parent, metadata, reply_content)
        if self._last_effects is not None and parent.get("header", {}).get("msg_type") == "execute_request":
            metadata.setdefault(names.KERNEL_INFO_SECTION, {})["effects"] = self._last_effects
            self._last_effects = None
        return metadata

    def sigint_handler(self) -> Any:
        return self.interrupts.hold

    # -- control-channel handlers (Control thread) -----------------------------------------
    async def ivralo_deadline_notice(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """The host's deadline for ``msg_id`` passed: record why, and interrupt the main thread.

        The signal is thread-directed: a process-directed SIGINT (killpg) is taken by whichever
        thread Linux picks, often a running user thread, and then a main thread blocked in
        ``join()`` or a lock never wakes. The host falls back to killpg after ``act_before``
        (CLOCK_MONOTONIC), so a notice that arrives later must not interrupt a second time.
        """
        content = parent.get("content", {})
        msg_id, deadline_ms, act_before = content.get("msg_id"), content.get("deadline_ms"), content.get("act_before")
        ok = isinstance(msg_id, str) and isinstance(deadline_ms, int) and isinstance(act_before, float)
        interrupted = False
        if ok and msg_id == self._executing:
            # Late too: the host's own SIGINT is on its way then, and its interrupt is the deadline's.
            self.deadline_notices.add(msg_id, deadline_ms)
        if ok and msg_id == self._executing and time.monotonic() < act_before:
            main = threading.main_thread().ident
            assert main is not None
            interrupt_cell(main)
            interrupted = True
        reply = {"status": "ok" if ok else "error", "interrupted": interrupted}
        self._reply(stream, ident, parent, "ivralo_deadline_notice_reply", reply)

    async def ivralo_broker_hello(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """The host hears our IOPub and reaches our control channel: broker requests may go now."""
        ok = BROKER.hello(parent.get("content", {}).get("comm_id"))
        self._reply(stream, ident, parent, "ivralo_broker_hello_reply", {"status": "ok" if ok else "error"})

    async def ivralo_egress_note(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """What the host's egress proxy decided, for the running cell's "hosts tried" line."""
        content = parent.get("content") or {}
        host, port = content.get("host"), content.get("port")
        if STATE.network is not None and isinstance(host, str):
            reason = str(content.get("reason") or "")[:200]
            STATE.network.note_proxied(
                host, port if isinstance(port, int) else None, bool(content.get("allowed")), reason
            )
        self._reply(stream, ident, parent, "ivralo_egress_note_reply", {"status": "ok"})

    def _running_request_id(self) -> str | None:
        """The msg_id a broker request is bound to: the request this thread's cell runs for."""
        msg_id = (self.get_parent().get("header") or {}).get("msg_id")
        return msg_id if isinstance(msg_id, str) else None

    async def ivralo_data_chunk(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        """A piece of a table the host sends behind a Kernel Gateway (no reply: the request that binds
        it follows on shell)."""
        ref = (parent.get("content") or {}).get("ref")
        if isinstance(ref, str):
            dataplane.take_chunk(ref, parent.get("buffers") or [])

    async def ivralo_status_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        self._reply(stream, ident, parent, "ivralo_status_reply", {"status": "ok", "executing": self._executing})

    async def _refuse_control_execute(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        content = {
            "status": "error",
            "ename": "PermissionError",
            "evalue": CONTROL_EXECUTE_REFUSED,
            "traceback": [f"PermissionError: {CONTROL_EXECUTE_REFUSED}"],
            "execution_count": self.execution_count,
        }
        self._reply(stream, ident, parent, "execute_reply", content)

    async def _refuse_subshell(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        content = {"status": "error", "ename": "RuntimeError", "evalue": SUBSHELLS_REFUSED, "traceback": []}
        self._reply(stream, ident, parent, "create_subshell_reply", content)

    def _reply(self, stream: Any, ident: Any, parent: dict[str, Any], msg_type: str, content: dict[str, Any]) -> None:
        assert self.session is not None
        self.session.send(stream, msg_type, content, parent, ident)

    def publish_own_status(self, status: str, channel: str, parent: dict[str, Any] | None) -> bool:
        """(ipykernel's ``_publish_status``, through ``compat.KernelOverrides``) True: published here,
        or dropped; False: ipykernel publishes it as usual."""
        parent = parent or self.get_parent(channel)
        msg_type = parent.get("header", {}).get("msg_type", "")
        if channel == "control" and msg_type.startswith("ivralo_"):
            return True  # the host's own questions must not flip a frontend's busy indicator
        if not (channel == "shell" and status == "busy" and msg_type == "execute_request") or self.session is None:
            return False
        # The routing identity of the requester rides along (frontends ignore unknown metadata):
        # if this execution is killed, the host answers it in its cell, on the shell port.
        idents = compat.shell_parent_ident(self)
        requester: list[str] = [i.hex() for i in idents] if isinstance(idents, list) else []
        self.session.send(
            self.iopub_socket,
            "status",
            {"execution_state": status},
            parent=parent,
            ident=compat.iopub_topic(self, "status"),
            metadata={names.KERNEL_INFO_SECTION: {names.META_REQUESTER: requester}},
        )
        return True


_GUARDS = os.path.dirname(guards_package.__file__) + os.sep


def _without_guard_frames(tb: Any) -> Any:
    """The traceback up to the last frame before ivralo's guards: a refusal reads as the line that
    tried, then the error's sentence (the guards' frames say nothing a person can act on)."""
    frames, node = [], tb
    while node is not None:
        frames.append(node)
        node = node.tb_next
    cut = next((i for i, f in enumerate(frames) if f.tb_frame.f_code.co_filename.startswith(_GUARDS)), None)
    if cut is None or cut == 0:
        return tb
    frames[cut - 1].tb_next = None
    return tb


def _show_exception(shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: int | None = None) -> list[str]:
    """IPython's custom-exception hook: the deadline message for its KeyboardInterrupt; a guard's
    refusal without the guard's frames; a cell refused before it ran as its one sentence; a file looked
    for in the sandbox's own /tmp with the sentence that says so (``error_hints``); anything else as
    usual."""
    kernel = shell.kernel
    if isinstance(kernel, IvraloKernel):
        kernel.interrupts.leave_code()  # the cell's code is over: a SIGINT now must not cut its display
    if issubclass(etype, KeyboardInterrupt):
        msg_id = kernel._executing if isinstance(kernel, IvraloKernel) else None
        deadline_ms = kernel.deadline_notices.get(msg_id) if isinstance(kernel, IvraloKernel) else None
        if deadline_ms is not None:
            stb = [DeadlineNotices.text(deadline_ms)]
            compat.show_traceback(shell, etype, value, stb)
            return stb
    elif issubclass(etype, SecurityError):  # refused before it ran: no line of it, and none of IPython's
        stb_only = SecurityError._render_traceback_(value)  # type: ignore[arg-type]
        compat.show_traceback(shell, etype, value, stb_only)
        return stb_only
    else:
        tb = _without_guard_frames(tb)
    stb_: list[str] = shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
    sandboxed = str(STATE.layers.get("sandbox", "")).startswith(names.SANDBOX_BWRAP)
    hint = private_tmp_hint(value, STATE.workspace, sandboxed)
    if hint is not None:
        stb_ = [*stb_, hint]
    compat.show_traceback(shell, etype, value, stb_)
    return stb_


class _ReplacementGate:
    """A kernel that replaces a killed one binds the same ports; clients reconnect on their own
    (libzmq retries every 100 ms), the shell socket sometimes before the IOPub one, and a request
    served then would lose its output. So the first requests wait until ``SETTLE_S`` after this
    kernel bound its ports. (ipykernel's XPUB reports only the first subscriber, so counting them
    is not possible without touching its IOPub thread.)"""

    SETTLE_S = 0.6

    def __init__(self) -> None:
        self.until = time.monotonic() + self.SETTLE_S

    async def wait(self) -> None:
        delay = self.until - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
