"""[supervisor] Start the kernel, follow it, and take its whole tree down when anything ends.

Order of steps, and why each comes where it does:

0. In a sandbox, one line on the host's "sandbox built" pipe: the host's start waits for it, so a
   bwrap that exits without building the sandbox is a start failure at once, not a missed deadline.
1. Note our parent, then drop credentials from our own exec-time environment by re-executing
   (``/proc/<pid>/environ`` keeps the block we were started with; deleting keys changes nothing).
2. Become a child subreaper, so every orphan in the kernel's tree is reparented to us.
3. Ask for a catchable parent-death signal, then compare ``getppid()`` with the parent noted in
   step 1: a host that died before the request was made sends no signal.
   Then the base seccomp filter (``protocol.seccomp``), if bwrap did not load it already.
4. Pass SIGINT on to the kernel's process group. The kernel gets a process group of its own, so
   exactly one SIGINT reaches it whichever way the interrupt came: jupyter_client signals our
   group (we alone are in it), VS Code signals the pid it launched (us).
5. Fork and exec the kernel in a session (and process group) of its own, with a scrubbed
   environment, a stage pipe, and a SIGKILL parent-death signal, so a supervisor that is itself
   SIGKILLed does not leave a kernel behind.
6. Wait. The kernel exiting, SIGTERM (stop gracefully), SIGUSR1 (kill now), the parent-death
   signal, or a changed ``getppid()`` each end the wait; then the whole tree is frozen and killed,
   and we exit with the kernel's status.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time
from typing import Any

import ivralo_kernel.supervisor.linux as linux

# Only what is needed before the kernel is forked is imported here: from the fork on, the kernel's
# start runs beside ours (on another core), so what the loop needs is imported after it, and what
# only an ending or a failure needs, then.
from ivralo_kernel.protocol import KernelPolicy, database_env_names, names, scrub
from ivralo_kernel.protocol.bootstrap import module_argv
from ivralo_kernel.protocol.owner_stamp import stamp_folder

# Host asks for an immediate end of the whole tree (the provisioner's kill, an agent's Esc).
SIGNAL_KILL_NOW = signal.SIGUSR1
# Delivered by the kernel of the OS when our parent exits; catchable so that we can clean up.
SIGNAL_PARENT_DIED = signal.SIGHUP
# After a graceful SIGTERM, how long the kernel gets to exit on its own.
TERM_GRACE_S = 3.0
# How often the parent is checked by pid, in case the death signal was missed.
PARENT_POLL_S = 0.5
# How long the kernel's start waits for the host to cover the closed links (a short process of its own).
LINK_COVER_WAIT_S = 10.0
# Stages kept for the failure log: a real start reports about ten, each once.
MAX_STAGES = 64

_WATCHED = (signal.SIGCHLD, signal.SIGTERM, signal.SIGQUIT, signal.SIGINT, SIGNAL_KILL_NOW, SIGNAL_PARENT_DIED)


def _say_sandbox_built() -> None:
    """Step 0: tell the host that bwrap built the sandbox and ran us (it waits for this line, or for
    EOF: bwrap exited first). Once, then closed, before any code of the kernel's can run."""
    given = os.environ.pop(names.ENV_SANDBOX_UP_FD, "")
    if not given:
        return
    from ivralo_kernel.protocol import pipe

    with contextlib.suppress(ValueError, OSError):
        fd = int(given)
        try:
            os.write(fd, pipe.encode(pipe.Stage(names.STAGE_SANDBOX_BUILT)))
        finally:
            os.close(fd)


def _reexec_without_secrets(workspace: str) -> None:
    db_names, _ = database_env_names(workspace, os.environ)
    clean, removed = scrub(os.environ, db_names)
    if removed:
        # Same pid, same parent: only the exec-time environment block changes.
        os.execve(sys.executable, list(sys.orig_argv), clean)  # noqa: S606 - re-exec of ourselves


def _kernel_env(workspace: str, stage_fd: int, tmp: str) -> dict[str, str]:
    db_names, _ = database_env_names(workspace, os.environ)
    env, _ = scrub(os.environ, db_names)
    env.update(
        {
            names.ENV_TMPDIR: tmp,
            # ipykernel's parent poller exits the kernel when this pid stops being its parent.
            names.ENV_PARENT_PID: str(os.getpid()),
            names.ENV_SUPERVISOR_PID: str(os.getpid()),
            names.ENV_STAGE_FD: str(stage_fd),
            names.ENV_WORKSPACE: workspace,
            names.ENV_LAUNCHED_AT: repr(time.time()),
            # No process started through the kernel writes __pycache__ into the workspace.
            "PYTHONDONTWRITEBYTECODE": "1",
        }
    )
    return env


def _seccomp(direct_links: bool = False) -> str:
    """The base seccomp filter over us and the kernel's tree: bwrap loaded it already in a sandbox
    (``--seccomp``, before our first instruction); in the fallback it is installed here, before the
    kernel is forked. Returns who installed it (``bwrap``, ``supervisor``) or why there is none."""
    from ivralo_kernel.protocol.sandbox import seccomp

    arch = seccomp.this_arch()
    if arch is None:
        return "none: no filter for this architecture"
    # The host says it gave bwrap the filter, and a filter is there (a container's runtime may have
    # one of its own, so the count alone would not say it is ours).
    if os.environ.pop(names.ENV_SECCOMP_BY_BWRAP, "") == "1" and seccomp.filters_in_force() > 0:
        return "bwrap"
    linux.leave_the_session_keyring(arch.nr("keyctl"))  # before the filter refuses keyctl
    try:
        # We are in the fallback: the network is kept to TCP here too (we relay only TCP, to the proxy);
        # with direct links allowed (landlock_network) UDP too, or their names would not resolve.
        seccomp.install(seccomp.base_filter(arch, fallback=True, udp=direct_links), arch)
    except seccomp.SeccompUnavailable as exc:
        print(f"ivralo supervisor: no seccomp filter: {exc}", file=sys.stderr)
        return f"none: Linux refused it ({str(exc).replace(',', ';')})"
    return "supervisor"


def _wait_for_link_covers() -> None:
    """The closed names that are links: the host mounts each over itself from outside (it alone
    can: protocol/sandbox/link_mounts.py); the kernel starts once each is a mount point here. One the host
    could not cover is said on stderr, and the host's log names it if it was replaced by the end."""
    given = os.environ.pop(names.ENV_COVER_LINKS, None)
    if given is None:
        return
    from ivralo_kernel.protocol.sandbox import link_mounts

    try:
        paths = link_mounts.parse(given)
    except ValueError:
        paths = []
    left = link_mounts.wait_until_covered(paths, LINK_COVER_WAIT_S)
    for path in left:
        os.write(
            2, f"ivralo supervisor: the closed link {path!r} stays replaceable: the host did not cover it\n".encode()
        )
    os.environ[names.ENV_SUPERVISOR_LAYERS] += f",covered_links={len(paths) - len(left)}"


def _start_kernel(argv: list[str], env: dict[str, str], stderr_fd: int) -> int:
    # Frozen standard modules hide their source from the debugger: breakpoints in them are missed.
    cmd = module_argv(sys.executable, "ivralo_kernel.kernel", argv, ("-P", "-B", "-Xfrozen_modules=off"), env=env)
    supervisor = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:  # in the child: undo what is ours, then become the kernel
        # A session of its own, first (so its group is there for an interrupt): no controlling
        # terminal, so a TIOCSTI from the kernel's tree has no person's shell to type into, and an
        # interrupt for our group is passed on to this one, once.
        os.setsid()
        for signum in _WATCHED:
            signal.signal(signum, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        os.dup2(stderr_fd, 2)
        linux.set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != supervisor:
            os._exit(1)
        os.execve(cmd[0], cmd, env)  # noqa: S606 - argv is ours, no shell involved
    except BaseException as exc:  # noqa: BLE001 - nothing may return into the parent's code
        os.write(2, f"ivralo supervisor: cannot start the kernel: {exc}\n".encode())
    os._exit(127)


def _private_tmp() -> str:
    """A new folder only we can use, made as ``tempfile.mkdtemp`` makes it, in the first usable
    folder of the ones it tries, but without importing tempfile (with shutil and random) before
    the fork: the supervisor's own start is on the kernel's way to ready."""
    candidates = [os.environ.get(var) for var in ("TMPDIR", "TEMP", "TMP")]
    # A private 0700 folder with a random name, in the temp folders tempfile would try.
    candidates += ["/tmp", "/var/tmp", "/usr/tmp", os.getcwd()]  # noqa: S108
    error: OSError = FileNotFoundError("no usable temporary folder")
    for base in filter(None, candidates):
        for _ in range(100):
            path = os.path.join(os.path.abspath(base), "ivralo-kernel-" + os.urandom(6).hex())
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                continue
            except OSError as exc:  # not a folder, not writable: the next one
                error = exc
                break
            return path
    raise error


def _host_pipe() -> int | None:
    """The read end of the host's life pipe, if the host gave one (kept from the kernel's tree)."""
    try:
        given = int(os.environ.pop(names.ENV_HOST_PIPE_FD, ""))
        # The host passes the pipe under its own number, which a host with many kernels (their
        # sockets, relays) puts above 1023, out of select()'s range: moved to our lowest free one.
        fd = os.dup(given)  # not inheritable
        os.close(given)
        os.set_blocking(fd, False)
    except (ValueError, OSError):
        return None
    # The host keeps one pipe for every kernel of a launch (a restart, a replacement): what is in it
    # now was written for the kernel before this one (a kill time for an execution of a kernel that
    # crashed). No execution of ours exists yet, so none of it is ours: left, it would end our tree.
    with contextlib.suppress(BlockingIOError, OSError):
        while os.read(fd, 65536):
            pass
    return fd


def _let_go_of_broker_socket() -> None:
    """The kernel has the broker's socket now (inherited): ours goes, so that the kernel's exit is the
    host's EOF on it (protocol/broker_frames.py), and no request can come from this process."""
    with contextlib.suppress(ValueError, OSError):
        os.close(int(os.environ.get(names.ENV_BROKER_FD, "")))


def _write_worker_log(workspace: str, stages: list[str], how: str, stderr_tail: bytes) -> None:
    """Record why a kernel did not come up, where a person (and the host's error) will look."""
    from pathlib import Path

    from ivralo_kernel.protocol import worker_log

    message = f"ivralo kernel failed to start: it {how} before it was ready."
    path = Path(workspace) / names.WORKER_LOG
    try:
        worker_log.append(path, worker_log.start_failure(message, stages, stderr_tail.decode(errors="replace")))
    except OSError as exc:
        print(f"ivralo supervisor: cannot write {path}: {exc.strerror}", file=sys.stderr)
    print(f"ivralo supervisor: the kernel {how} before it was ready; see {path}", file=sys.stderr)


class _StderrRelay:
    """The kernel's stderr passes through us: forwarded as it comes, its tail kept for the log."""

    TAIL_BYTES = 8192

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self.tail = b""
        self.open = True

    def pump(self) -> None:
        chunk = os.read(self.read_fd, 65536)
        if not chunk:
            self.open = False
            os.close(self.read_fd)
            return
        self.tail = (self.tail + chunk)[-self.TAIL_BYTES :]
        try:
            os.write(2, chunk)
        except OSError:  # nobody reads our stderr any more; keep the tail anyway
            pass

    def drain(self) -> None:
        os.set_blocking(self.read_fd, False)
        while self.open:
            try:
                self.pump()
            except BlockingIOError:
                return


def _egress_relay() -> Any:
    """The way out, when the host gave us its egress socket: in the sandbox on its fixed port, in the
    fallback on a loopback port the OS picks (the host's ``0``). Bound now, started after the fork."""
    relay_port, egress_socket = os.environ.get(names.ENV_RELAY_PORT), os.environ.get(names.ENV_EGRESS_SOCKET)
    if not relay_port or not egress_socket:
        return None
    from ivralo_kernel.supervisor.relay import bind_relay

    return bind_relay(relay_port, egress_socket, sandboxed=os.environ.get(names.ENV_SANDBOX) == names.SANDBOX_BWRAP)


def _proxy_env(port: int) -> dict[str, str]:
    url = f"http://127.0.0.1:{port}"
    env = dict.fromkeys(names.PROXY_VARIABLES, url)
    env["NO_PROXY"] = env["no_proxy"] = ""  # localhost too: the host knows which one is meant
    env[names.ENV_RELAY_PORT] = str(port)
    return env


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    _say_sandbox_built()  # step 0
    parent = os.getppid()
    policy = KernelPolicy.from_env(os.environ, os.getcwd())
    workspace = policy.workspace
    _reexec_without_secrets(workspace)  # step 1

    linux.set_not_dumpable()  # the kernel can neither trace us nor write our memory (our backstop)
    subreaper = linux.set_child_subreaper()  # step 2
    death_signal = linux.set_parent_death_signal(SIGNAL_PARENT_DIED)  # step 3
    filtered = _seccomp(direct_links=policy.landlock_network)
    os.environ[names.ENV_SUPERVISOR_LAYERS] = (
        f"subreaper={int(subreaper)},parent_death_signal={int(death_signal)},seccomp={filtered}"
    )
    limits = os.environ.pop(names.ENV_NAMESPACE_LIMITS, None)
    if limits is not None:  # in the sandbox, before anything of the kernel's runs
        import ivralo_kernel.supervisor.namespace_limits as namespace_limits

        try:
            lowered = namespace_limits.apply(limits)
        except (namespace_limits.LimitError, ValueError, OSError) as exc:
            os.write(2, f"ivralo supervisor: cannot set the sandbox's namespace limits: {exc}\n".encode())
            return 1
        os.environ[names.ENV_SUPERVISOR_LAYERS] += f",namespace_limits={len(lowered)}"
    _wait_for_link_covers()
    if os.getppid() != parent:
        return 1

    host_pipe = _host_pipe()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    for signum in _WATCHED:  # a Python-level handler so the C handler writes to the wake pipe
        signal.signal(signum, lambda *_: None)  # SIGINT too: step 4, passed on in the loop below

    stage_r, stage_w = os.pipe()
    os.set_inheritable(stage_w, True)
    stderr = _StderrRelay()
    tmp = _private_tmp()  # the kernel's private temp folder; removed below
    # Without a sandbox the folder is on the host's /tmp: stamped as ours, so that after a SIGKILL (no
    # removal below) the next host's start sweeps it. In the sandbox, /tmp is the sandbox's own tmpfs.
    sandboxed = os.environ.get(names.ENV_SANDBOX) == names.SANDBOX_BWRAP
    tmp_stamp = None if sandboxed else stamp_folder(tmp)
    relay = _egress_relay()
    kernel_env = _kernel_env(workspace, stage_w, tmp)
    if relay is not None:  # the port it listens on, for the kernel's proxy variables and Landlock's TCP rule
        kernel_env |= _proxy_env(relay.port)
    kernel = _start_kernel(args, kernel_env, stderr.write_fd)  # step 5
    os.close(stage_w)
    _let_go_of_broker_socket()
    os.close(stderr.write_fd)
    if relay is not None:  # its threads only after the fork: the kernel's child must not start with threads
        relay.start()
    import ivralo_kernel.supervisor.tree as tree
    from ivralo_kernel.protocol import pipe
    from ivralo_kernel.protocol.processes import describe_exit, exit_code
    from ivralo_kernel.supervisor.backstop import Backstop

    stages: list[str] = []  # the first MAX_STAGES - 1 and the latest (code in the kernel can write many)
    stage_lines = pipe.LineReader()
    kernel_status: int | None = None
    term_deadline: float | None = None
    backstop = Backstop(kernel_may_disarm=not policy.host_enforces_deadline)
    host_lines = pipe.LineReader()
    deadline_kill = False
    stopped_by: str | None = None
    stage_open = True
    while kernel_status is None:  # step 6
        timeout = PARENT_POLL_S
        for wake in (term_deadline, backstop.kill_at):
            if wake is not None:
                timeout = max(0.0, min(timeout, wake - time.monotonic()))
        watch = [wake_r] + ([stage_r] if stage_open else []) + ([stderr.read_fd] if stderr.open else [])
        watch += [host_pipe] if host_pipe is not None else []
        ready, _, _ = select.select(watch, [], [], timeout)
        if stderr.open and stderr.read_fd in ready:
            stderr.pump()
        if stage_r in ready:
            chunk = os.read(stage_r, 4096)
            if not chunk:
                stage_open = False
                os.close(stage_r)
            for message in stage_lines.feed(chunk):
                if isinstance(message, pipe.Stage):
                    if len(stages) < MAX_STAGES:
                        stages.append(message.name)
                    else:
                        stages[-1] = message.name
                elif isinstance(message, pipe.KillAt):
                    backstop.apply(message, from_host=False)
                elif isinstance(message, pipe.KillNow):
                    backstop.apply(pipe.KillAt("kill-now", time.monotonic()), from_host=False)
        received = set(os.read(wake_r, 512)) if wake_r in ready else set()
        if signal.SIGINT in received:  # step 4: the interrupt is for the kernel and its children
            with contextlib.suppress(ProcessLookupError):
                os.killpg(kernel, signal.SIGINT)
        for pid, status in tree.reap_children():
            if pid == kernel:
                kernel_status = status
        # The parent-death signal also fires when the *thread* that started us exits while the host
        # process lives on (jupyter_client may launch from a runner thread): only a changed
        # getppid() means the host is gone.
        host_gone = False
        if host_pipe is not None and host_pipe in ready:
            chunk = os.read(host_pipe, 4096)
            host_gone = not chunk
            for message in host_lines.feed(chunk):
                if isinstance(message, pipe.KillAt):  # the host's pipe carries nothing else
                    backstop.apply(message, from_host=True)
        if SIGNAL_KILL_NOW in received or os.getppid() != parent or host_gone:
            stopped_by = "was stopped by the host" if SIGNAL_KILL_NOW in received else "lost its host"
            break
        if received & {signal.SIGTERM, signal.SIGQUIT} and term_deadline is None:
            term_deadline = time.monotonic() + TERM_GRACE_S
            try:
                os.kill(kernel, signal.SIGTERM)
            except ProcessLookupError:
                pass
        if term_deadline is not None and time.monotonic() >= term_deadline:
            break
        if backstop.kill_at is not None and time.monotonic() >= backstop.kill_at:
            deadline_kill = True
            print(
                "ivralo supervisor: the running cell outlived its deadline and grace; ending the kernel's tree",
                file=sys.stderr,
            )
            break

    for pid, status in tree.kill_tree(os.getpid()):
        if pid == kernel:
            kernel_status = status
    if stderr.open:
        stderr.drain()
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    if tmp_stamp is not None:
        os.close(tmp_stamp)  # after the removal: a sweep that sees it unlocked finds nothing left
    built = names.STAGE_KERNEL_BUILT in stages
    if not built and term_deadline is None:  # a start that failed, or that the host gave up on
        how = stopped_by or describe_exit(exit_code(kernel_status or 0))
        _write_worker_log(workspace, stages, how, stderr.tail)
    if deadline_kill:
        return names.DEADLINE_EXIT_STATUS
    if kernel_status is None:
        return 128 + signal.SIGKILL
    return exit_code(kernel_status)
