"""[host] A raw launch in the OS sandbox: the host for a kernel that a client starts itself.

VS Code runs kernel.json's argv as written, with a connection file of TCP ports it chose, and no
jupyter_client provisioner. The supervisor it starts finds no host and hands over to this module
(exec: the same pid, so VS Code's SIGINT and SIGTERM still reach the process it launched). Here:

1. The setting (``IVRALO_SANDBOX_SETTING`` from kernel.json's env: auto, required) and whether
   bubblewrap can build a sandbox on this machine. If not: ``required`` refuses to start, saying
   why; ``auto`` runs the kernel with the fallback's layers (below) and says so in the banner.
2. The client's connection file is completed if it must be (no file, or ports 0: ipykernel's own
   behaviour), and a second one is written for the kernel, over ``ipc`` in its private run folder.
   Without a sandbox (``auto`` where none can be built, or ``off``), the same host runs the
   supervisor as its child, with the same relay and proxy: the fallback's kernel links are ipc too.
3. The egress proxy, as the provisioner runs it, except that nobody is asked: the allow list alone
   decides (a raw launch has no channel to a person's prompt of its own). And the deadline, as the
   provisioner enforces it: the host's watchdog (interrupt, confirm, kill the tree), the
   supervisor's backstop armed on this process's pipe, which only this process can disarm. The
   kernel's own watchdog stays off: everything inside the sandbox is the cell's to stop or rewrite.
4. The sandbox, built as the provisioner builds it, with the supervisor inside as its pid 1.
5. The five channels relayed between the client's TCP ports and the kernel's sockets.
6. Signals: SIGINT is passed to the supervisor (an interrupt); SIGTERM, SIGHUP, or the client's
   death end the kernel, gracefully first. When the kernel ends, this process exits with its status.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ivralo_kernel.host.history.ledger import HistoryRecorder
from ivralo_kernel.host.jupyter.kernelspec import SUPERVISOR_MODULE
from ivralo_kernel.host.sandbox import memory_cgroup
from ivralo_kernel.host.sandbox.bwrap import choose_bwrap
from ivralo_kernel.host.sandbox.closed_paths import TOOL_FILES_DEFAULT
from ivralo_kernel.host.sandbox.launch import (
    CHANNELS,
    SandboxFolder,
    SandboxStart,
    kernel_connection,
    sandboxed_command,
)
from ivralo_kernel.host.sandbox.plan import dotenv_for_kernel, dotenv_set_aside, prepare_workspace
from ivralo_kernel.host.settings.config_files import config_files
from ivralo_kernel.host.settings.file_problems import settings_file_lines
from ivralo_kernel.host.settings.workspace_files import DOTENV, PERMISSIONS, WorkspaceFiles, protected_in_sandbox
from ivralo_kernel.protocol import KernelPolicy, database_env_names, names, scrub
from ivralo_kernel.protocol.bootstrap import module_argv
from ivralo_kernel.protocol.processes import from_returncode
from ivralo_kernel.protocol.trust import is_trusted

if TYPE_CHECKING:
    from ivralo_kernel.host.sandbox.channel_relay import ChannelRelay
    from ivralo_kernel.host.watch.watchdog import Watchdog

# As the supervisor's own (supervisor/run.py SIGNAL_KILL_NOW): end the whole tree now.
SIGNAL_KILL_NOW = signal.SIGUSR1
SUPERVISOR_KILL_BUDGET_S = 3.0  # as the provisioner's: then SIGKILL, a supervisor that did not end the tree cannot
TERM_GRACE_S = 5.0  # the supervisor's own grace (3 s) and its clean-up, before we end it ourselves
PARENT_POLL_S = 0.5
_WATCHED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD)


def _supervisor_argv(args: list[str]) -> list[str]:
    return module_argv(sys.executable, SUPERVISOR_MODULE, args)


def kernel_env(workspace: str, files: WorkspaceFiles, protected: frozenset[str]) -> dict[str, str]:
    """This environment without credentials, with the workspace ``.env``'s plain values (read here:
    the kernel never reads the file), unless a kernel of this workspace changed it (see config_watch)."""
    db_names, problems = database_env_names(workspace, os.environ)
    env, _ = scrub(os.environ, db_names)
    env.pop(names.ENV_SANDBOX_SETTING, None)
    env[names.ENV_WORKSPACE] = workspace
    lines = [*files.begin(protected), *filter(None, [dotenv_set_aside(workspace)])]
    lines += settings_file_lines(workspace, problems, files.usable(PERMISSIONS))
    for line in lines:
        print(f"ivralo: {line}", file=sys.stderr)
    if lines:
        env[names.ENV_HOST_NOTES] = "\n".join(lines)
    env.update(dotenv_for_kernel(workspace, env, files.usable(DOTENV)))
    return env


def _fallback(args: list[str], workspace: str, why: str) -> int:
    """No sandbox: the supervisor runs the kernel on the fallback's layers and says why, as this
    process's child, with the same relay and egress proxy as in the sandbox (the kernel's Jupyter
    links are ipc in its private run folder; its TCP rule lets it reach the proxy only)."""
    parent = os.getppid()
    connection_file = os.path.abspath(_connection_file_arg(args))
    client = client_connection(connection_file)
    folder = SandboxFolder.create()
    try:
        return _run(None, folder, client, connection_file, args, parent, workspace, why)
    finally:
        folder.remove()


def client_connection(path: str) -> dict[str, Any]:
    """The client's connection info, completed and written back as ipykernel would: ports it left
    at 0 (or no file at all) are chosen here, and the file is written with them."""
    try:
        with open(path, encoding="utf-8") as f:
            info: dict[str, Any] = json.load(f)
    except FileNotFoundError:
        info = {}
    if info.get("transport", "tcp") == "tcp" and all(int(info.get(f"{c}_port") or 0) for c in CHANNELS):
        return info
    from jupyter_client.connect import write_connection_file

    port = {c: int(info.get(f"{c}_port") or 0) for c in CHANNELS}
    _, written = write_connection_file(
        path,
        shell_port=port["shell"],
        iopub_port=port["iopub"],
        stdin_port=port["stdin"],
        hb_port=port["hb"],
        control_port=port["control"],
        ip=str(info.get("ip") or "127.0.0.1"),
        key=str(info.get("key") or uuid.uuid4()).encode(),
        signature_scheme=str(info.get("signature_scheme") or "hmac-sha256"),
        kernel_name=str(info.get("kernel_name") or ""),
    )
    return dict(written)


def _connection_file_arg(args: list[str]) -> str:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("-f", dest="connection_file", required=True)
    known, _ = parser.parse_known_args(args)
    return str(known.connection_file)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if config_files():  # the person's settings files; kernel.json's env (already in ours) wins over them
        from ivralo_kernel.host.settings.resolve import raw_launch_settings

        for var, value in raw_launch_settings().items():
            os.environ.setdefault(var, value)
    setting = os.environ.get(names.ENV_SANDBOX_SETTING, "auto")
    workspace = os.path.realpath(KernelPolicy.from_env(os.environ, os.getcwd()).workspace)
    if setting == "off":
        return _fallback(args, workspace, "turned off by the kernelspec (sandbox='off')")
    choice = choose_bwrap()  # which bwrap, what it lacks and what is used instead: for the banner
    bwrap, why = choice.path, choice.why
    if bwrap is None:
        if setting == "required":
            print(_required_but(why), file=sys.stderr)
            return 1
        return _fallback(args, workspace, why)

    parent = os.getppid()
    connection_file = os.path.abspath(_connection_file_arg(args))
    client = client_connection(connection_file)
    folder = SandboxFolder.create()
    try:
        return _run(bwrap, folder, client, connection_file, args, parent, workspace, choice.report())
    except SandboxNotBuilt as failure:  # bwrap exited at once: fail now, or run without it now
        folder.remove()
        if setting == "required":
            print(_required_but(str(failure)), file=sys.stderr)
            return 1
        print(f"ivralo: {failure}", file=sys.stderr)
        return _fallback(args, workspace, str(failure))
    finally:
        folder.remove()


class SandboxNotBuilt(RuntimeError):
    """bwrap exited without building the sandbox; the message is what it said."""


def _required_but(why: str) -> str:
    return (
        f"ivralo: this kernel must run in an OS sandbox (sandbox='required' in its kernelspec), but "
        f"{why}. Install bubblewrap or allow user namespaces, or reinstall the kernelspec with "
        f"--sandbox auto to run with the Python guards and Landlock only."
    )


def _run(
    bwrap: str | None,
    folder: SandboxFolder,
    client: dict[str, Any],
    connection_file: str,
    args: list[str],
    parent: int,
    workspace: str,
    bwrap_report: str,
) -> int:
    inner_file, inner = kernel_connection(client, folder, abstract=bwrap is None)
    prepare_workspace(workspace)  # .ivralo exists before the sandbox mounts it (and the host watches it)
    files = WorkspaceFiles(workspace)
    history = HistoryRecorder(workspace, TOOL_FILES_DEFAULT)  # before the kernel: what is there is not its own
    env = kernel_env(workspace, files, protected_in_sandbox(workspace) if bwrap is not None else frozenset())
    policy = KernelPolicy.from_env(os.environ, workspace)
    if policy.deadline_ms:
        env[names.ENV_HOST_ENFORCES_DEADLINE] = "1"
    # The supervisor inside sees EOF when this process is gone; the deadline's backstop lines come on it.
    life_r, life_w = os.pipe()
    os.set_blocking(life_w, False)  # a wedged supervisor must not block this host's watchdog
    env[names.ENV_HOST_PIPE_FD] = str(life_r)
    inner_args = [*args]
    inner_args[inner_args.index("-f") + 1] = inner_file
    if bwrap is None:  # the fallback: ``bwrap_report`` says why there is no sandbox
        env[names.ENV_SANDBOX] = bwrap_report
        env[names.ENV_EGRESS_SOCKET] = folder.egress_socket
        env[names.ENV_RELAY_PORT] = str(names.RELAY_PORT_ANY)  # the supervisor picks a loopback port
        command = _supervisor_argv(inner_args)
    else:
        notes = (env.get(names.ENV_HOST_NOTES), f"OS sandbox built with {bwrap_report}")  # for the banner
        env[names.ENV_HOST_NOTES] = "\n".join(filter(None, notes))
        command = sandboxed_command(
            bwrap,
            folder,
            workspace,
            _supervisor_argv(inner_args),
            env,
            read_only_files=(inner_file,),
            tool_files=TOOL_FILES_DEFAULT,
            jupyter_runtime_dir=os.path.dirname(connection_file),
            devices=policy.devices,
        )
    # A memory cgroup where cgroup v2 delegates one (host/sandbox/memory_cgroup.py): this launch has no
    # memory observer, so its limit is the kernel's memory limit, enforced by the Linux kernel on every page.
    group, memory_note = memory_cgroup.make("auto", None, policy.memory_limit_bytes)
    env[names.ENV_HOST_NOTES] = "\n".join(filter(None, (env.get(names.ENV_HOST_NOTES), f"Memory: {memory_note}")))
    if group is not None:
        command = group.join_command(command)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    for signum in _WATCHED:
        signal.signal(signum, lambda *_: None)
    # The kernel starts first: the rest is set up while it boots (its first proxied request, or a
    # message through the relay, is hundreds of milliseconds away).
    start = SandboxStart()
    pass_fds = start.pass_to(env, (life_r, *folder.rewind_seccomp()))
    try:
        process = subprocess.Popen(
            command,
            env=env,
            cwd=workspace,
            pass_fds=pass_fds,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        os.close(life_r)
        # The supervisor's first line, or bwrap's exit: a sandbox that cannot be built is said now.
        failure = start.wait(process, bwrap) if bwrap is not None else None
    finally:
        start.close()
    if failure is not None:
        signal.set_wakeup_fd(-1)
        os.close(life_w)
        files.end()
        if group is not None:
            group.remove()
        raise SandboxNotBuilt(failure)
    # Loaded only now: each is tens of milliseconds the kernel's start need not wait for.
    import psutil

    from ivralo_kernel.host.sandbox.channel_relay import ChannelRelay
    from ivralo_kernel.host.sandbox.egress import EgressDesk
    from ivralo_kernel.host.sandbox.egress_proxy import EgressProxy, Verdict
    from ivralo_kernel.host.sandbox.kernel_output import relay_output
    from ivralo_kernel.host.watch.processes import find_in_tree

    relay_output(process)
    desk = EgressDesk(workspace, is_trusted(workspace, os.environ), files=files)

    def decide(host: str, port: int) -> Verdict:
        return Verdict(*desk.decide(host, port, None, None, lambda _on: None))

    proxy = EgressProxy(folder.egress_socket, decide)
    proxy.start()
    relay = ChannelRelay(client, inner, watch_requests=bool(policy.deadline_ms))
    relay.start()
    stop_by: float | None = None
    # Found once, then kept: a scan of the process table every half second costs CPU, and a scan
    # that races a process starting or ending in the tree could miss it and drop an interrupt.
    supervisor_process: psutil.Process | None = None

    def supervisor_now() -> int | None:
        nonlocal supervisor_process
        if supervisor_process is None:
            with contextlib.suppress(psutil.Error, TypeError):
                supervisor_process = psutil.Process(find_in_tree(process.pid, SUPERVISOR_MODULE))  # type: ignore[arg-type]
        # is_running() compares the start time too: a pid reused after the supervisor ended is not it.
        return supervisor_process.pid if supervisor_process and supervisor_process.is_running() else None

    watchdog = None
    if policy.deadline_ms:
        watchdog = deadline_watchdog(policy, client, process, relay, supervisor_now, lambda: life_w)
        watchdog.start()
    while process.poll() is None:
        ready, _, _ = select.select([wake_r], [], [], PARENT_POLL_S)
        received = set(os.read(wake_r, 512)) if ready else set()
        if history.changed():  # the write guard kept a copy: recorded on the recorder's own thread
            history.poke()
        supervisor = supervisor_now()
        if signal.SIGINT in received and supervisor is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(supervisor, signal.SIGINT)  # it passes the interrupt on to the kernel's group
        ending = received & {signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT} or os.getppid() != parent
        if ending and stop_by is None:
            stop_by = time.monotonic() + TERM_GRACE_S
            if supervisor is not None and signal.SIGTERM in received:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(supervisor, signal.SIGTERM)  # graceful: the kernel's own shutdown
            else:
                os.close(life_w)  # the supervisor ends the whole sandbox at once
                life_w = -1
        if stop_by is not None and time.monotonic() >= stop_by:
            if life_w >= 0:
                os.close(life_w)
                life_w = -1
            elif time.monotonic() >= stop_by + TERM_GRACE_S:  # a supervisor that cannot end: SIGKILL
                for pid in (supervisor, process.pid):
                    with contextlib.suppress(ProcessLookupError, TypeError):
                        os.kill(pid, signal.SIGKILL)  # type: ignore[arg-type]
    if watchdog is not None:
        watchdog.stop()
    if group is not None:  # what left the tree (a setsid child) goes with it
        group.remove()
    proxy.close()
    files.end()
    history.close()
    loss = watchdog.loss if watchdog is not None else None
    if loss is not None and loss.cause.startswith("timeout"):
        # Ended for its deadline, by this host or by the supervisor's backstop: the status says so
        # either way, as timeout(1)'s does (VS Code shows it).
        return names.DEADLINE_EXIT_STATUS
    return from_returncode(process.returncode)


def deadline_watchdog(
    policy: KernelPolicy,
    client: dict[str, Any],
    process: subprocess.Popen[bytes],
    relay: ChannelRelay,
    supervisor: Callable[[], int | None],
    host_pipe: Callable[[], int],
) -> Watchdog:
    """The provisioner's watchdog, for this kernel's deadline: it reads the kernel's channels as any
    client does, tells a client's execution from a "busy" the kernel published itself (the relay's
    ``requested``) and a finished one from a kernel that only says so (``replied``), interrupts
    through the supervisor, and keeps the supervisor's backstop armed on
    this process's pipe. Its kill is the supervisor's kill-now, for the whole tree."""
    from ivralo_kernel.host.watch.escalation import DeadlinePolicy
    from ivralo_kernel.host.watch.watchdog import Watchdog, WatchdogSettings
    from ivralo_kernel.protocol.pipe import KillAt, encode

    assert policy.deadline_ms is not None
    settings = WatchdogSettings(deadline=DeadlinePolicy(policy.deadline_ms, True, policy.interrupt_grace_ms))

    def signal_supervisor(signum: int) -> None:
        pid = supervisor()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def kill_tree() -> None:
        """Ask the supervisor (it kills the tree and exits); SIGKILL it after the budget. It is the
        sandbox's pid 1: when it ends, by any signal, Linux ends every process inside."""
        pid = supervisor()
        signal_supervisor(SIGNAL_KILL_NOW)
        if pid is None:
            return

        def finish() -> None:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

        timer = threading.Timer(SUPERVISOR_KILL_BUDGET_S, finish)
        timer.daemon = True
        timer.start()

    def backstop(execution: str, kill_at: float | None) -> None:
        with contextlib.suppress(OSError):  # full (a wedged supervisor) or closed: the watchdog still acts
            os.write(host_pipe(), encode(KillAt(execution, kill_at)))

    return Watchdog(
        client,
        process.pid,
        settings,
        kill_tree,
        exit_status=process.poll,
        interrupt=lambda: signal_supervisor(signal.SIGINT),
        backstop=backstop,
        requested=relay.requested,
        replied=relay.replied,
        turn=relay.turn,
    )


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # the channel proxies' threads end with the process
