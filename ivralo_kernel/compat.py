"""Every use ivralo makes of a private (underscore) name or an undocumented behaviour of ipykernel,
IPython and jupyter_client, in this one module.

Checked with ipykernel 7.4.0, IPython 9.18.1 and jupyter_client 8.10.0 (``CHECKED_WITH``). The pins
in pyproject.toml allow newer minor versions, which may rename or reshape any of these:
``tests/test_compat.py`` has a test per entry that fails naming the internal and what to re-check,
and a test that fails when an installed version is not the one checked here. After an upgrade, run
it first, fix what it names, then update ``CHECKED_WITH``.

Rooms: this module imports no third-party package at its top and no ivralo room (protocol alone
would be allowed: both processes run it). The kernel's code (which may use ipykernel and IPython)
and the host's (jupyter_client) share it; an entry that needs a library imports it in its own body,
and ``tests/test_layering.py`` checks that each room uses only the entries whose imports it may make.

ipykernel calls the methods it lets subclasses override by their private names, so those overrides
are methods of the mixins below (``KernelOverrides``, ``KernelAppOverrides``), placed before
ipykernel's class in the bases. Each mixin method does only the translation, and calls a hook with an
ivralo name that the kernel's own class implements: the policy stays in ``ivralo_kernel/kernel``.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import signal
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

CHECKED_WITH = {"ipykernel": "7.4", "IPython": "9.18", "jupyter_client": "8.10"}


# -- kernel side: ipykernel ---------------------------------------------------------------------
class KernelOverrides:
    """Mixin for the kernel class (before ``IPythonKernel`` in its bases): the private methods of
    ``ipykernel.kernelbase.Kernel`` / ``ipykernel.ipkernel.IPythonKernel`` that ivralo overrides."""

    def _publish_status(self, status: str, channel: str, parent: dict[str, Any] | None = None) -> None:
        """Overrides ``Kernel._publish_status(status, channel, parent=None)``, which ipykernel 7.4 calls
        for every IOPub busy/idle (from ``dispatch_shell``, ``dispatch_control``,
        ``_publish_status_and_flush``). Hands the status to ``publish_own_status`` first.

        If renamed or no longer called: ivralo's own control questions flip a frontend's busy
        indicator to idle mid-cell, and a killed execution's requester is unknown to the host (its
        cell is never answered).
        """
        if not self.publish_own_status(status, channel, parent):
            cast(Any, super())._publish_status(status, channel, parent)

    def publish_own_status(self, status: str, channel: str, parent: dict[str, Any] | None) -> bool:
        """Hook: True when the kernel published this status itself (or drops it); False: ipykernel's."""
        return False

    @contextmanager
    def _cancel_on_sigint(self, future: asyncio.Future[Any]) -> Iterator[None]:
        """Overrides ``IPythonKernel._cancel_on_sigint(future)``: ipykernel 7.4's ``do_execute`` wraps
        an awaiting cell's future in it (``with cm(coro_future)``, main thread only).

        SIGINT cancels an awaiting cell at once (ipykernel#881). ipykernel queues the cancellation with
        tornado's ``add_callback``, which on the loop's own thread uses a plain ``call_soon``: the
        self-pipe is never written, ``select()`` keeps sleeping, and ``await asyncio.sleep(30)`` ends
        30 s later. ``call_soon_threadsafe`` wakes it.

        If renamed or no longer used: interrupts and deadlines reach awaiting cells only when their
        await ends (measured: 29 s late).
        """
        loop = asyncio.get_running_loop()

        def handle_sigint(*_: object) -> None:
            loop.call_soon_threadsafe(lambda: future.done() or future.cancel())

        previous = signal.signal(signal.SIGINT, handle_sigint)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def pre_handler_hook(self) -> None:
        """Overrides ``Kernel.pre_handler_hook()``, which ipykernel 7.4's ``dispatch_shell`` calls before
        each shell handler to set ``default_int_handler`` (saved in ``saved_sigint_handler``, which
        ``post_handler_hook`` puts back). Sets ``sigint_handler()`` instead.

        If renamed or no longer called: a second SIGINT during a cell's end loses its execute_reply
        (kernel/interrupts.py), and the host kills the kernel at its deadline + grace.
        """
        self.saved_sigint_handler = signal.signal(signal.SIGINT, self.sigint_handler())

    def sigint_handler(self) -> Callable[[int, Any], None]:
        """Hook: the SIGINT handler for shell messages."""
        return signal.default_int_handler


def wrap_run_code(shell: Any, enter: Callable[[Any], Any], leave: Callable[[], None]) -> None:
    """Calls ``enter(code) -> code`` before and ``leave()`` after each top-level statement a cell
    runs: ``InteractiveShell.run_code(code_obj, result=None, *, async_=False)`` (IPython 9.18, awaited
    by ``run_ast_nodes`` once per statement; its exception handling and traceback display are inside).
    Set on the instance, so IPython's own callers get it.

    If renamed or no longer called: every SIGINT during an execution is held and none raised, so
    interrupts and deadlines stop nothing and the host kills at deadline + grace (tests/test_deadlines.py).
    """
    original = shell.run_code

    async def run_code(code_obj: Any, result: Any = None, *, async_: bool = False) -> Any:
        run = enter(code_obj)
        try:
            return await original(run, result, async_=async_ and run is code_obj)
        finally:
            leave()

    shell.run_code = run_code


def shell_parent_ident(kernel: Any) -> Any:
    """The routing identities of the running shell request's sender (a list of bytes frames), from
    any thread: ``Kernel._get_shell_context_var(Kernel._shell_parent_ident)`` (ipykernel 7.4; set by
    ``set_parent``; the lookup falls back on the shell's context in threads that user code started).
    ``Kernel._parent_ident["shell"]`` is a backward-compatibility view of the same value.

    If it changes: the host cannot answer a killed execution's cell (it no longer knows the
    requester).
    """
    return kernel._get_shell_context_var(kernel._shell_parent_ident)


def iopub_topic(kernel: Any, topic: str) -> bytes:
    """The IOPub topic ipykernel gives a message type: ``Kernel._topic(topic)``, ipykernel 7.4:
    ``b"kernel.<ident>.<topic>"``.

    If it changes: the status messages ivralo sends itself carry a topic unlike ipykernel's own;
    clients that subscribe by topic miss them.
    """
    return cast(bytes, kernel._topic(topic))


def route_control(kernel: Any, msg_type: str, handler: Callable[..., Any]) -> None:
    """Serve ``msg_type`` on the control channel with ``handler``: ``Kernel.control_handlers`` is the
    dict ``dispatch_control`` looks handlers up in (ipykernel 7.4; built in ``__init__`` from
    ``control_msg_types``, which by default holds every shell type, ``execute_request`` included).

    If it changes: ``execute_request`` on control runs user code on the Control thread, where no
    interrupt or deadline reaches it, and subshells can be created again.
    """
    kernel.control_handlers[msg_type] = handler


def defer_debugger_import(on_built: Callable[[Any], None] | None = None) -> type:
    """Keep debugpy out of a kernel's start: import it at the first ``debug_request`` instead.

    ipykernel 7.4 imports ``ipykernel.debugger``, and debugpy with it (about 50 ms of CPU, a sixth of
    a kernel's start), in ``IPythonKernel.__init__``, only to read ``_is_debugpy_available`` and build
    a ``Debugger`` that does nothing until a client sends ``debug_request``. Its other readers
    (``kernel_info``'s ``supported_features``, ``do_debug_request``, ``dispatch_debugpy``) import the
    same name from the same module inside the method. So this puts a stand-in module under
    ``ipykernel.debugger`` whose ``_is_debugpy_available`` is whether debugpy can be found, and
    which imports the real module at the first other name asked of it; and it returns the class to
    give ``IPythonKernel.debugger_class``: it keeps ``Debugger``'s arguments and builds the real one
    at the first attribute asked of it (``process_request``, on the first ``debug_request``), except
    ``handle_stopped_event``, which ``IPythonKernel.start`` has the control thread await in a loop
    from the start.

    If it changes: the debugger is missing from ``kernel_info`` (JupyterLab hides its bug icon) or
    a ``debug_request`` fails; ``tests/test_compat.py`` and the debugger tests say which.
    """
    name = "ipykernel.debugger"

    def real_module() -> types.ModuleType:
        if isinstance(sys.modules.get(name), _DeferredModule):
            del sys.modules[name]
        return importlib.import_module(name)

    class _DeferredModule(types.ModuleType):
        def __getattr__(self, attribute: str) -> Any:  # names not set below: the real module's
            if attribute.startswith("__"):  # the import system's questions (``__path__``): not a package
                raise AttributeError(attribute)
            return getattr(real_module(), attribute)

    class DeferredDebugger:
        """``ipykernel.debugger.Debugger``, built when first used."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._arguments = (args, kwargs)
            self._debugger: Any = None
            self._built = asyncio.Event()  # bound to the control thread's loop at its first wait

        def __getattr__(self, attribute: str) -> Any:
            if self._debugger is None:
                args, kwargs = self._arguments
                self._debugger = real_module().Debugger(*args, **kwargs)
                if on_built is not None:  # the kernel's own settings for it (kernel.own_ports)
                    on_built(self._debugger)
                self._built.set()
            return getattr(self._debugger, attribute)

        async def handle_stopped_event(self) -> None:
            """``IPythonKernel.start`` has the control thread await this in a loop from the start:
            it waits for the debugger to exist instead of building it."""
            await self._built.wait()
            await self._debugger.handle_stopped_event()

    if name not in sys.modules:
        stand_in = _DeferredModule(name)
        stand_in._is_debugpy_available = importlib.util.find_spec("debugpy") is not None  # type: ignore[attr-defined]
        sys.modules[name] = stand_in
    return DeferredDebugger


# -- kernel side: IPython -------------------------------------------------------------------------
def show_traceback(shell: Any, etype: type, value: BaseException, stb: list[str]) -> None:
    """Show a structured traceback as the cell's error: ``InteractiveShell._showtraceback(etype,
    evalue, stb)`` (IPython 9.18), which ipykernel's ``ZMQInteractiveShell`` overrides to publish the
    IOPub ``error`` and fill the ``execute_reply`` (ipykernel 7.4). A ``set_custom_exc`` handler must
    show its traceback itself (``run_code`` only keeps what it returns); ``showtraceback`` does it so.

    If it changes: a deadline's interrupt and a guard's refusal show no error in the cell.
    """
    shell._showtraceback(etype, value, stb)


def check_shell_commands(shell: Any, check: Callable[[str], None]) -> None:
    """Call ``check(command)`` before each ``!command`` and ``x = !command`` of ``shell`` runs, on the
    command as the shell gets it (IPython's ``$name`` and ``{expression}`` expanded).
    ``ZMQInteractiveShell.system_piped`` (ipykernel 7.4; ``system`` is it) runs a ``!`` line through its
    module's global ``system``, and ``InteractiveShell.getoutput`` (IPython 9.18) through its module's
    ``getoutput`` or ``get_output_error_code``; each of those globals is replaced by one that calls
    ``check`` first (what it raises is the cell's error, and the command does not run).

    If it changes: ``!pip install`` aimed outside the workspace runs, and pip's own read-only-file-system
    error is all the person sees.
    """
    for method, names in (("system_piped", ("system",)), ("getoutput", ("getoutput", "get_output_error_code"))):
        namespace = getattr(type(shell), method).__globals__
        for name in names:
            original = namespace[name]
            if getattr(original, "_ivralo_checked", False):
                continue

            def checked(cmd: str, *args: Any, _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
                check(cmd)
                return _original(cmd, *args, **kwargs)

            checked._ivralo_checked = True  # type: ignore[attr-defined]
            namespace[name] = checked


# -- kernel side: ipykernel's application -------------------------------------------------------
class KernelAppOverrides:
    """Mixin for the kernel application (before ``IPKernelApp`` in its bases)."""

    def _bind_socket(self, s: Any, port: int) -> Any:
        """Overrides ``IPKernelApp._bind_socket(s, port)``: ipykernel 7.4 binds each channel's socket
        there right after creating it, IOPub's XPUB included (``init_iopub``, before its IOPub thread
        starts). Calls ``before_bind(s)`` first.

        If renamed or no longer used for IOPub: options set in ``before_bind`` are lost, so the XPUB
        reports only the first subscriber and later clients (or the host's watchdog) never get their
        ``iopub_welcome``.
        """
        self.before_bind(s)
        return cast(Any, super())._bind_socket(s, port)

    def before_bind(self, socket: Any) -> None:
        """Hook: set options on a channel's socket before it is bound."""


def quiet_welcomes(iopub_thread: Any, quiet: Callable[[str], bool]) -> None:
    """No ``iopub_welcome`` for the subscriptions ``quiet`` names: wraps the ``IOPubThread``'s
    ``_send_welcome_message(subscription)``, which ipykernel 7.4 calls on the IOPub thread for each
    subscription its XPUB reports (``_handle_subscription``), on the instance.

    If it changes: the host's watchdog's subscriptions to its own topics (protocol/iopub_topics.py)
    are welcomed too, under those topics, and every client subscribed to everything gets the
    welcome; one that connects at the same moment may take it for its own (jupyter_kernel_test's
    check: a client's first IOPub message is its welcome, for ``""``).
    """
    send = iopub_thread._send_welcome_message

    def send_unless_quiet(subscription: str) -> None:
        if not quiet(subscription):
            send(subscription)

    iopub_thread._send_welcome_message = send_unless_quiet


# -- host side: jupyter_client --------------------------------------------------------------------
def popen_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``launch_kernel``'s keyword arguments without those ``Popen`` refuses:
    ``LocalProvisioner._scrub_kwargs(kwargs)`` (jupyter_client 8.10: a copy without
    ``extra_arguments`` and ``kernel_id``).

    If it changes: relaunching a killed kernel on the same ports fails with a ``TypeError`` from
    ``Popen``, and the kernel's clients see it die instead.
    """
    from jupyter_client.provisioning.local_provisioner import LocalProvisioner

    return LocalProvisioner._scrub_kwargs(kwargs)


def adopt_process(provisioner: Any, process: Any) -> None:
    """Make ``process`` (a ``Popen`` that is its session's leader) the kernel a ``LocalProvisioner``
    watches: its ``process``, ``pid`` and ``pgid`` attributes, which ``LocalProvisioner.launch_kernel``
    sets and ``poll``, ``wait``, ``send_signal``, ``kill`` and ``terminate`` read (jupyter_client
    8.10; setting them from outside ``launch_kernel`` is not documented).

    If it changes: after a replacement, jupyter_client polls and signals the dead kernel, sees a
    death, and its restarter starts yet another kernel.
    """
    provisioner.process = process
    provisioner.pid = provisioner.pgid = process.pid  # a session leader: pid = pgid
