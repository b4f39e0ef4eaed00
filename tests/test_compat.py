"""One test per ipykernel, IPython and jupyter_client internal that ``ivralo_kernel/compat.py`` uses.

After a library upgrade, run this file first: each test fails naming the internal, what changed
(missing, another signature, another behaviour) and the compat entry to re-check, with that entry's
own words on what breaks. No kernel is started: ipykernel's ``Kernel`` and ``IPKernelApp`` are built
bare (a socket pair for IOPub), which is enough to drive their real dispatch code. The two checks
that send SIGINT or build an IPython shell run in a child interpreter.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

import ipykernel
import IPython
import jupyter_client
import pytest
import zmq
from ipykernel.ipkernel import IPythonKernel
from ipykernel.kernelapp import IPKernelApp
from ipykernel.kernelbase import Kernel
from ipykernel.zmqshell import ZMQInteractiveShell
from IPython.core.interactiveshell import InteractiveShell
from jupyter_client.launcher import launch_kernel
from jupyter_client.provisioning.local_provisioner import LocalProvisioner
from jupyter_client.session import Session

from ivralo_kernel import compat
from ivralo_kernel.kernel.app import IvraloKernelApp
from ivralo_kernel.kernel.kernel import IvraloKernel

CHILD_TIMEOUT_S = 60


def changed(internal: str, entry: Any, what: str) -> str:
    """The failure message: which internal, what changed, which compat entry to re-check and why."""
    doc = textwrap.indent(inspect.getdoc(entry) or "", "    ")
    return (
        f"\n\n*** {internal} changed: {what}.\n"
        f"*** Re-check ivralo_kernel/compat.py: {entry.__qualname__} against the installed library "
        f"(compat was checked with {compat.CHECKED_WITH}). It says:\n{doc}\n"
    )


def member(owner: Any, name: str, entry: Any) -> Any:
    found = inspect.getattr_static(owner, name, None)
    if found is None:
        pytest.fail(changed(f"{owner.__module__}.{owner.__qualname__}.{name}", entry, "it is gone"))
    return getattr(owner, name)


def assert_params(
    owner: Any, name: str, expected: list[str], entry: Any, defaults: dict[str, Any] | None = None
) -> None:
    internal = f"{owner.__module__}.{owner.__qualname__}.{name}"
    func = member(owner, name, entry)
    params = inspect.signature(inspect.unwrap(func)).parameters
    assert list(params) == expected, changed(internal, entry, f"its parameters are {list(params)}, not {expected}")
    for param, default in (defaults or {}).items():
        got = params[param].default
        assert got == default, changed(internal, entry, f"the default of {param} is {got!r}, not {default!r}")


def source_calls(owner: Any, name: str, needle: str, entry: Any) -> None:
    """ipykernel calls the overridden method by its name from ``owner.name`` (read in its source)."""
    source = inspect.getsource(member(owner, name, entry))
    internal = f"{owner.__module__}.{owner.__qualname__}.{name}"
    assert needle in source, changed(internal, entry, f"it no longer calls {needle!r}, so the override is never used")


# -- the installed versions --------------------------------------------------------------------
@pytest.mark.fast  # starts no process
@pytest.mark.parametrize("module", [ipykernel, IPython, jupyter_client], ids=lambda m: m.__name__)
def test_installed_version_is_the_one_compat_was_checked_with(module: Any) -> None:
    installed = ".".join(module.__version__.split(".")[:2])
    checked = compat.CHECKED_WITH[module.__name__]
    assert installed == checked, (
        f"\n\n*** {module.__name__} {module.__version__} is installed; ivralo_kernel/compat.py was checked with "
        f"{checked}. Every other test in tests/test_compat.py must pass; then read each compat entry against "
        f"the new source and update compat.CHECKED_WITH.\n"
    )


@pytest.mark.fast  # starts no process
def test_the_kernel_and_its_app_use_the_compat_overrides() -> None:
    # Nobody redefines them in ivralo_kernel/kernel: the private names live in compat alone.
    for cls, name, mixin in (
        (IvraloKernel, "_publish_status", compat.KernelOverrides),
        (IvraloKernel, "_cancel_on_sigint", compat.KernelOverrides),
        (IvraloKernelApp, "_bind_socket", compat.KernelAppOverrides),
    ):
        assert getattr(cls, name) is getattr(mixin, name), f"{cls.__name__}.{name} is not compat's override"


@pytest.mark.parametrize(
    ("library_class", "hook"),
    [(IPythonKernel, "publish_own_status"), (IPKernelApp, "before_bind")],
)
@pytest.mark.fast  # starts no process
def test_the_hook_names_are_not_ipykernels(library_class: type, hook: str) -> None:
    assert not hasattr(library_class, hook), (
        f"\n\n*** {library_class.__qualname__} now has its own {hook!r}: ivralo's hook of that name (see "
        f"ivralo_kernel/compat.py) overrides it unknowingly. Rename ivralo's hook.\n"
    )


# -- ipykernel's Kernel, driven bare ---------------------------------------------------------------
class ProbeKernel(compat.KernelOverrides, Kernel):
    """ipykernel's base kernel with compat's overrides, recording what reaches ivralo's hooks."""

    control_msg_types = [*Kernel.control_msg_types, "ivralo_probe"]  # noqa: RUF012 - ipykernel API

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seen: list[tuple[Any, ...]] = []

    def publish_own_status(self, status: str, channel: str, parent: dict[str, Any] | None) -> bool:
        requester = compat.shell_parent_ident(self) if channel == "shell" else None
        self.seen.append(("status", status, channel, requester))
        return False  # ipykernel publishes it: its IOPub message is checked too

    async def should_handle(self, stream: Any, msg: Any, idents: Any) -> bool:  # type: ignore[override]
        return False  # the shell request stops here: busy, then idle

    async def ivralo_probe(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        self.seen.append(("ivralo_probe", ident))

    async def refuse(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        self.seen.append(("refused", parent["header"]["msg_type"]))


class Probe:
    def __init__(self, kernel: ProbeKernel, iopub: list[list[bytes]]) -> None:
        self.kernel, self.iopub = kernel, iopub


@pytest.fixture
def sockets() -> Iterator[tuple[zmq.Socket[Any], zmq.Socket[Any]]]:
    context = zmq.Context()
    a, b = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    a.bind("inproc://compat")
    b.connect("inproc://compat")
    yield a, b
    a.close(linger=0)
    b.close(linger=0)
    context.term()


@pytest.fixture
def probe(sockets: tuple[zmq.Socket[Any], zmq.Socket[Any]]) -> Probe:
    """Two control requests and one shell request through ipykernel's real dispatch code."""
    iopub, reader = sockets
    kernel = ProbeKernel(session=Session(key=b"compat"), iopub_socket=iopub, log=logging.getLogger("compat"))
    compat.route_control(kernel, "execute_request", kernel.refuse)

    def frames(msg_type: str) -> list[zmq.Frame]:
        msg = kernel.session.msg(msg_type, {})
        return [zmq.Frame(f) for f in kernel.session.serialize(msg, ident=[b"client-1"])]

    async def run() -> None:
        await kernel.process_control(frames("execute_request"))
        await kernel.process_control(frames("ivralo_probe"))
        await kernel.dispatch_shell(frames("execute_request"))

    asyncio.run(run())
    published = []
    while reader.poll(0):
        published.append(reader.recv_multipart())
    return Probe(kernel, published)


@pytest.mark.fast  # starts no process
def test_publish_status_has_its_signature() -> None:
    entry = compat.KernelOverrides._publish_status
    assert_params(Kernel, "_publish_status", ["self", "status", "channel", "parent"], entry, {"parent": None})


@pytest.mark.fast  # starts no process
def test_publish_status_carries_every_busy_and_idle(probe: Probe) -> None:
    statuses = [s[1:3] for s in probe.kernel.seen if s[0] == "status"]
    expected = [("busy", "control"), ("idle", "control")] * 2 + [("busy", "shell"), ("idle", "shell")]
    assert statuses == expected, changed(
        "ipykernel.kernelbase.Kernel._publish_status",
        compat.KernelOverrides._publish_status,
        f"dispatching two control requests and a shell request reached it as {statuses}, not {expected}",
    )
    # Falling through, ipykernel publishes each itself.
    session = probe.kernel.session
    types = [session.deserialize(session.feed_identities(f)[1])["msg_type"] for f in probe.iopub]
    assert types == ["status"] * 6, changed(
        "ipykernel.kernelbase.Kernel._publish_status", compat.KernelOverrides._publish_status, f"it published {types}"
    )


@pytest.mark.fast  # starts no process
def test_topic_is_the_one_ipykernel_gives_its_own_status(probe: Probe) -> None:
    topics = {f[0] for f in probe.iopub}
    ours = compat.iopub_topic(probe.kernel, "status")
    assert topics == {ours}, changed(
        "ipykernel.kernelbase.Kernel._topic",
        compat.iopub_topic,
        f"ipykernel's status went out as {topics}, ours {ours!r}",
    )


@pytest.mark.fast  # starts no process
def test_control_handlers_route_control_requests(probe: Probe) -> None:
    handled = [s for s in probe.kernel.seen if s[0] != "status"]
    expected = [("refused", "execute_request"), ("ivralo_probe", [b"client-1"])]
    assert handled == expected, changed(
        "ipykernel.kernelbase.Kernel.control_handlers (and control_msg_types)",
        compat.route_control,
        f"an execute_request and an ivralo_probe on control reached {handled}, not {expected}",
    )


@pytest.mark.fast  # starts no process
def test_shell_parent_ident_is_the_requester_in_any_thread(probe: Probe) -> None:
    requesters = [s[3] for s in probe.kernel.seen if s[0] == "status" and s[2] == "shell"]
    assert requesters == [[b"client-1"]] * 2, changed(
        "ipykernel.kernelbase.Kernel._get_shell_context_var / _shell_parent_ident",
        compat.shell_parent_ident,
        f"during a shell request from b'client-1' it gave {requesters}",
    )
    seen_by_thread: list[Any] = []

    def look() -> None:
        try:
            seen_by_thread.append(compat.shell_parent_ident(probe.kernel))
        except Exception as error:  # reported below, with what to re-check
            seen_by_thread.append(error)

    thread = threading.Thread(target=look)
    thread.start()
    thread.join()
    assert seen_by_thread == [[b"client-1"]], changed(
        "ipykernel.kernelbase.Kernel._get_shell_context_var",
        compat.shell_parent_ident,
        f"from another thread it gave {seen_by_thread} (the shell context's fallback is gone)",
    )


def test_cancel_on_sigint_is_what_ipykernel_wraps_an_awaiting_cell_in() -> None:
    entry = compat.KernelOverrides._cancel_on_sigint
    assert_params(IPythonKernel, "_cancel_on_sigint", ["self", "future"], entry)
    source_calls(IPythonKernel, "do_execute", "self._cancel_on_sigint", entry)
    # Ours, for real: SIGINT while a cell awaits a 30 s sleep cancels it at once. In a child: a SIGINT
    # that found no handler would end this test run.
    code = textwrap.dedent(
        """
        import asyncio, signal, threading, time
        from ivralo_kernel.compat import KernelOverrides

        awaiting = threading.Event()

        async def cell():
            awaiting.set()
            await asyncio.sleep(600)  # far past the child's timeout: only the SIGINT can end it in time

        def interrupt():
            awaiting.wait(10)
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

        async def main():
            future = asyncio.ensure_future(cell())
            threading.Thread(target=interrupt, daemon=True).start()
            start = time.monotonic()
            with KernelOverrides()._cancel_on_sigint(future):
                try:
                    await future
                except asyncio.CancelledError:
                    print(f"cancelled after {time.monotonic() - start:.2f} s")

        asyncio.run(main())
        """
    )
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:  # the cancel waits for the loop's next wake-up (ipykernel#881)
        raise AssertionError(
            changed(
                "ipykernel.ipkernel.IPythonKernel._cancel_on_sigint", entry, "SIGINT did not cancel the awaiting cell"
            )
        ) from None
    assert done.returncode == 0 and done.stdout.startswith("cancelled after"), changed(
        "ipykernel.ipkernel.IPythonKernel._cancel_on_sigint", entry, f"the child said {done.stdout!r} {done.stderr!r}"
    )


# -- IPython -------------------------------------------------------------------------------------
def test_showtraceback_shows_a_custom_handlers_traceback() -> None:
    for shell_class in (InteractiveShell, ZMQInteractiveShell):
        assert_params(shell_class, "_showtraceback", ["self", "etype", "evalue", "stb"], compat.show_traceback)
    # For real, in a child (an IPython shell changes the interpreter's hooks): a custom-exception
    # handler that shows its structured traceback through compat.
    code = textwrap.dedent(
        """
        from IPython.core.interactiveshell import InteractiveShell
        from traitlets.config import Config
        from ivralo_kernel import compat

        config = Config()
        config.HistoryManager.enabled = False
        shell = InteractiveShell.instance(config=config)

        def handler(shell, etype, value, tb, tb_offset=None):
            stb = ["IVRALO-SHOWN: " + str(value)]
            compat.show_traceback(shell, etype, value, stb)
            return stb

        shell.set_custom_exc((OSError,), handler)
        result = shell.run_cell("raise OSError('refused')")
        print("error_in_exec:", type(result.error_in_exec).__name__)
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    shown = "IVRALO-SHOWN: refused" in done.stdout and "error_in_exec: OSError" in done.stdout
    assert done.returncode == 0 and shown, changed(
        "IPython.core.interactiveshell.InteractiveShell._showtraceback",
        compat.show_traceback,
        f"the child said {done.stdout[-1500:]!r} {done.stderr[-1500:]!r}",
    )


def test_shell_commands_run_through_the_module_globals_compat_checks() -> None:
    """``!cmd`` and ``x = !cmd`` reach the shell through the globals ``check_shell_commands`` wraps
    (read from the methods' code: wrapping them here would stay for the rest of the run)."""
    for owner, method, names in (
        (ZMQInteractiveShell, "system_piped", {"system"}),
        (ZMQInteractiveShell, "getoutput", {"getoutput", "get_output_error_code"}),
    ):
        found = member(owner, method, compat.check_shell_commands)
        used = set(found.__code__.co_names)
        assert names <= used and all(callable(found.__globals__.get(n)) for n in names), changed(
            f"{owner.__module__}.{owner.__qualname__}.{method}",
            compat.check_shell_commands,
            f"it no longer calls its module's {sorted(names)} (it calls {sorted(used)})",
        )
    assert ZMQInteractiveShell.system is ZMQInteractiveShell.system_piped, changed(
        "ipykernel.zmqshell.ZMQInteractiveShell.system", compat.check_shell_commands, "it is not system_piped"
    )


# -- ipykernel's application -----------------------------------------------------------------------
def test_bind_socket_sees_iopub_before_any_subscriber() -> None:
    entry = compat.KernelAppOverrides._bind_socket
    assert_params(IPKernelApp, "_bind_socket", ["self", "s", "port"], entry)
    # For real: ivralo's app binds IOPub through it, so every subscriber (not only the first) gets
    # ipykernel's iopub_welcome. In a child: ipykernel's IOPub thread leaves a pending task at exit.
    code = textwrap.dedent(
        """
        import zmq
        from jupyter_client.session import Session
        from ivralo_kernel.kernel.app import IvraloKernelApp

        context = zmq.Context()
        app = IvraloKernelApp(transport="tcp", ip="127.0.0.1", session=Session(key=b"compat"))
        app.init_iopub(context)
        welcomed = []
        for _ in range(2):
            sub = context.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(f"tcp://127.0.0.1:{app.iopub_port}")
            if sub.poll(10_000):
                msg = app.session.deserialize(app.session.feed_identities(sub.recv_multipart())[1])
                welcomed.append(msg["msg_type"])
            else:
                welcomed.append("nothing in 10 s")
        print(" ".join(welcomed))
        app.iopub_thread.stop()
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    assert done.stdout.split() == ["iopub_welcome", "iopub_welcome"], changed(
        "ipykernel.kernelapp.IPKernelApp._bind_socket (init_iopub)",
        entry,
        f"two subscribers got {done.stdout!r} {done.stderr[-2000:]!r}",
    )


# -- jupyter_client --------------------------------------------------------------------------------
def test_scrub_kwargs_leaves_what_popen_takes() -> None:
    assert isinstance(inspect.getattr_static(LocalProvisioner, "_scrub_kwargs", None), staticmethod), changed(
        "jupyter_client LocalProvisioner._scrub_kwargs", compat.popen_kwargs, "it is gone or no longer a staticmethod"
    )
    assert_params(LocalProvisioner, "_scrub_kwargs", ["kwargs"], compat.popen_kwargs)
    given = {"kernel_id": "k", "extra_arguments": [], "env": {"A": "1"}, "cwd": "/"}
    scrubbed = compat.popen_kwargs(given)
    assert scrubbed == {"env": {"A": "1"}, "cwd": "/"} and "kernel_id" in given, changed(
        "jupyter_client LocalProvisioner._scrub_kwargs", compat.popen_kwargs, f"it gave {scrubbed}"
    )
    # For real: what launch_kernel (and so Popen) takes when the host relaunches a killed kernel.
    process = launch_kernel([sys.executable, "-c", "pass"], **compat.popen_kwargs({**given, "cwd": None}))
    assert process.wait(timeout=CHILD_TIMEOUT_S) == 0


async def test_adopted_process_is_the_one_local_provisioner_polls_and_signals() -> None:
    provisioner = LocalProvisioner(kernel_id="compat", kernel_spec=None, parent=None)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        compat.adopt_process(provisioner, child)
        alive = await provisioner.poll()
        await provisioner.send_signal(signal.SIGTERM)  # killpg(pgid): the adopted group
        status = child.wait(timeout=CHILD_TIMEOUT_S)
        gone = await provisioner.poll()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert alive is None and status == -signal.SIGTERM and gone is not None, changed(
        "jupyter_client LocalProvisioner.process / pid / pgid",
        compat.adopt_process,
        f"poll() said {alive!r} while alive and {gone!r} after, the child ended with {status}",
    )
