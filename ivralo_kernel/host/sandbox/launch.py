"""[host] One kernel's sandbox on disk, and the command that starts the kernel in it.

Shared by the two hosts that build sandboxes: ``IvraloProvisioner`` (every jupyter_client host) and
the raw launch (``raw_launch``: VS Code runs kernel.json's argv itself). Each kernel gets a short
private folder, ``/tmp/ivralo-XXXX``: ``run/`` holds its Jupyter sockets (``ipc``) and the egress
proxy's socket, and is the only folder the sandbox shares with the host; ``empty`` is the file
mounted over each ``.env``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Any

import ivralo_kernel.host.sandbox.limits as sandbox_limits
from ivralo_kernel.host.sandbox.closed_paths import WorkspaceClaim
from ivralo_kernel.host.sandbox.kernel_output import printable
from ivralo_kernel.host.sandbox.owned_folders import make_owned_folder, release_owned_folder
from ivralo_kernel.host.sandbox.plan import SandboxPlan, prepare_workspace
from ivralo_kernel.protocol import names, pipe
from ivralo_kernel.protocol.sandbox import link_mounts, seccomp

PROXY_URL = f"http://127.0.0.1:{names.RELAY_PORT}"
CHANNELS = ("shell", "iopub", "stdin", "control", "hb")
PROXY_VARIABLES = names.PROXY_VARIABLES
# How long a start waits for the supervisor's "sandbox built" line. bwrap builds the sandbox in
# milliseconds and the supervisor says so before it imports anything heavy; a machine slower than
# this is left to the bootstrap budget (the wait ends, the start goes on), never failed here.
SANDBOX_BUILD_WAIT_S = 15.0
EXIT_WAIT_S = 2.0  # for bwrap's exit status and the rest of its stderr, once the pipe said it is gone
STDERR_KEPT = 4000
# The "sandbox built" line is a few dozen bytes; the host reads no further than this for it (whatever
# holds the pipe's write end may write without end, and without a newline).
BUILT_LINE_MAX = 4096
LINK_COVER_TIMEOUT_S = 10.0  # the helper that covers the closed links (python's start, a few syscalls)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SandboxFolder:
    root: str
    # The seccomp filter bwrap loads (``--seccomp FD``), in a memfd passed to each launch; -1 where
    # no filter can be built for this machine (the supervisor then says so).
    seccomp_fd: int = -1
    # This kernel's hold on each workspace's placeholders, given up when the folder is removed (the
    # kernel has ended by then, and the last one out removes them).
    claims: dict[str, WorkspaceClaim] = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def create(cls) -> SandboxFolder:
        # Short (a socket's sun_path holds 107 bytes), and stamped as ours: a later host's start removes
        # it if this one dies without cleaning up (owned_folders).
        root = make_owned_folder("ivralo-")
        os.makedirs(os.path.join(root, "run"), mode=0o700)
        folder = cls(root, _seccomp_program_fd())
        with open(folder.empty_file, "w", encoding="utf-8"):
            pass
        os.chmod(folder.empty_file, 0o444)
        return folder

    @property
    def run_dir(self) -> str:
        return os.path.join(self.root, "run")

    @property
    def empty_file(self) -> str:
        return os.path.join(self.root, "empty")

    @property
    def kernel_ip(self) -> str:
        """The ``ip`` of an ``ipc`` connection: socket files ``run/kernel-<port>``."""
        return os.path.join(self.run_dir, "kernel")

    @property
    def abstract_kernel_ip(self) -> str:
        """The fallback's ``ip``: abstract unix sockets, ``@ivralo-XXXX-kernel-<port>``. No file: and
        Landlock's scope (ABI 6) keeps every other kernel's tree from connecting to them, while the
        host, in no Landlock domain, connects. (In the sandbox they would be in its network
        namespace, out of the host's reach: there the run folder's files are used.)"""
        return f"@{os.path.basename(self.root)}-kernel"

    @property
    def egress_socket(self) -> str:
        return os.path.join(self.run_dir, "egress.sock")

    def clear_kernel_sockets(self) -> None:
        """A dead kernel's socket files: a new kernel binds the same (one still closing holds them)."""
        for number in range(1, len(CHANNELS) + 1):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.kernel_ip}-{number}")

    def rewind_seccomp(self) -> tuple[int, ...]:
        """The fds a launch passes on: bwrap reads the filter to its end, and every launch of this
        folder's kernel (a restart, a replacement) shares the one file offset."""
        if self.seccomp_fd < 0:
            return ()
        os.lseek(self.seccomp_fd, 0, os.SEEK_SET)
        return (self.seccomp_fd,)

    def remove(self) -> None:
        if self.seccomp_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.seccomp_fd)
        release_owned_folder(self.root)
        while self.claims:
            self.claims.popitem()[1].release()


def _seccomp_program_fd() -> int:
    arch = seccomp.this_arch()
    if arch is None:
        return -1
    try:
        fd = os.memfd_create("ivralo-seccomp", os.MFD_CLOEXEC)  # passed on by pass_fds alone
    except OSError:  # a container's profile may refuse memfd_create: the supervisor installs it then
        return -1
    os.write(fd, seccomp.base_filter(arch))
    return fd


def kernel_connection(
    client: dict[str, Any], folder: SandboxFolder, *, abstract: bool = False
) -> tuple[str, dict[str, Any]]:
    """The kernel's connection file: the client's key, ``ipc`` sockets in the run folder (read-only
    inside; the kernel finds every port given and writes nothing), or abstract ones (the fallback)."""
    info = {k: v for k, v in client.items() if k not in (f"{c}_port" for c in CHANNELS)}
    info |= {"transport": "ipc", "ip": folder.abstract_kernel_ip if abstract else folder.kernel_ip}
    info |= {f"{channel}_port": number for number, channel in enumerate(CHANNELS, start=1)}
    path = os.path.join(folder.root, "connection.json")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a restart: written again (read-only, so not opened for writing)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(info, f)
    os.chmod(path, 0o400)
    return path, info


def sandboxed_command(
    bwrap: str,
    folder: SandboxFolder,
    workspace: str,
    cmd: list[str],
    env: dict[str, str],
    *,
    read_only_files: tuple[str, ...],
    tool_files: tuple[str, ...],
    jupyter_runtime_dir: str | None,
    credential_stores: tuple[str, ...] = (),
    exchange_dir: str = "",
    memory_hard_limit_bytes: int | None = None,
    tmpfs_size_bytes: int | None = None,
    devices: tuple[str, ...] = (),
) -> list[str]:
    """``cmd`` wrapped in bwrap; ``env`` gains what the kernel needs inside (its way out)."""
    prepare_workspace(workspace)
    env[names.ENV_SANDBOX] = names.SANDBOX_BWRAP
    if folder.seccomp_fd >= 0:
        env[names.ENV_SECCOMP_BY_BWRAP] = "1"
    env[names.ENV_EGRESS_SOCKET] = folder.egress_socket
    env[names.ENV_RELAY_PORT] = str(names.RELAY_PORT)
    env.update(dict.fromkeys(PROXY_VARIABLES, PROXY_URL))
    env["NO_PROXY"] = env["no_proxy"] = ""  # localhost too: the relay knows which one is meant
    scratch = tmpfs_size_bytes or sandbox_limits.scratch_bytes(memory_hard_limit_bytes)
    limits = sandbox_limits.namespace_limits(scratch) if sandbox_limits.bwrap_adds_capabilities(bwrap) else ""
    if limits:
        env[names.ENV_NAMESPACE_LIMITS] = limits
    plan = SandboxPlan(
        bwrap=bwrap,
        workspace=workspace,
        run_dir=folder.run_dir,
        empty_file=folder.empty_file,
        read_only_files=read_only_files,
        tool_files=tool_files,
        env=env,
        jupyter_runtime_dir=jupyter_runtime_dir,
        scratch_overlays=(_ipython_dir(env),),
        code_trees=_code_trees(cmd[0]),
        host_trees=_host_trees(),
        credential_store_paths=credential_stores,
        exchange_dir=exchange_dir,
        scratch_bytes=scratch,
        namespace_limits=limits,
        sized_tmpfs=sandbox_limits.bwrap_sizes_tmpfs(bwrap),
        seccomp_fd=folder.seccomp_fd if folder.seccomp_fd >= 0 else None,
        devices=devices,
    )
    # Each missing closed path gets its placeholder now, on the host, so that argv mounts it read-only.
    claim = folder.claims.get(workspace) or folder.claims.setdefault(workspace, WorkspaceClaim(workspace))
    claim.hold(plan.missing())
    links = plan.closed_links()
    claim.note_links(links)  # a replaced one is named in the host's log when the kernel ends
    if links:  # each mounted over itself by the host once bwrap built the sandbox (SandboxStart.wait)
        env[names.ENV_COVER_LINKS] = json.dumps(list(links))
    return plan.argv(cmd)


def _code_trees(python: str) -> tuple[str, ...]:
    """Where the kernel's interpreter and ivralo's own code live (a venv's root, the interpreter it
    points to, an editable checkout)."""
    import ivralo_kernel

    roots = [os.path.dirname(os.path.dirname(os.path.abspath(python)))]
    roots.append(os.path.dirname(os.path.dirname(os.path.realpath(python))))
    package = os.path.dirname(os.path.abspath(ivralo_kernel.__file__))
    # The package itself too: an editable checkout that is the workspace keeps its host code closed.
    roots += [sys.prefix, sys.base_prefix, os.path.dirname(package), package]
    return tuple(roots)


def _host_trees() -> tuple[str, ...]:
    """The host's own interpreter and packages, and ivralo's code (an editable checkout too)."""
    import ivralo_kernel

    package = os.path.dirname(os.path.abspath(ivralo_kernel.__file__))
    return (sys.prefix, sys.base_prefix, os.path.dirname(package), package)


def _ipython_dir(env: dict[str, str]) -> str:
    """IPython's folder, made if missing (IPython would make it on first use; inside the sandbox the
    root is read-only, so it must exist before)."""
    path = env.get("IPYTHONDIR") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".ipython")
    with contextlib.suppress(OSError):
        os.makedirs(path, exist_ok=True)
    return path


class SandboxStart:
    """One launch's "sandbox built" pipe (``names.ENV_SANDBOX_UP_FD``): bwrap passes its write end to
    the supervisor, whose first act is one line on it. EOF before that line means every holder of the
    write end is gone without the supervisor running: bwrap exited, and its stderr says why."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        self.links = ""  # the closed links to cover once the sandbox is built (a JSON list), or none

    def pass_to(self, env: dict[str, str], pass_fds: tuple[int, ...]) -> tuple[int, ...]:
        """Give the write end to the launch (its environment names it); returns the new ``pass_fds``."""
        env[names.ENV_SANDBOX_UP_FD] = str(self.write_fd)
        self.links = env.get(names.ENV_COVER_LINKS, "")
        return (*pass_fds, self.write_fd)

    def wait(self, process: subprocess.Popen[bytes], bwrap: str, timeout: float = SANDBOX_BUILD_WAIT_S) -> str | None:
        """After the launch: None once the supervisor runs in its sandbox (or ``timeout`` passed);
        else why bwrap did not build it, in its own words. Reads bwrap's stderr only then, when
        nothing of the kernel's can have written to it."""
        self._close_write_end()
        deadline = time.monotonic() + timeout
        said = b""
        try:
            while b"\n" not in said and len(said) < BUILT_LINE_MAX:
                if not _readable(self.read_fd, deadline):
                    return None  # slow, not failed: the bootstrap budget decides
                chunk = os.read(self.read_fd, 256)
                if not chunk:
                    break
                said += chunk
        finally:
            self._close_read_end()
        if pipe.decode(said.split(b"\n")[0].decode(errors="replace")) == pipe.Stage(names.STAGE_SANDBOX_BUILT):
            if self.links:
                cover_links(process.pid, self.links)
            return None
        try:
            status: int | None = process.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            status = None
        lines = printable(_read_to_end(process.stderr, EXIT_WAIT_S)).splitlines()
        words = "; ".join(line.strip() for line in lines if line.strip()) or "(it wrote nothing on stderr)"
        how = f"exited with status {status}" if status is not None else "closed the pipe"
        return f"bubblewrap ({bwrap}) {how} without building the sandbox: {words[-STDERR_KEPT:]}"

    def close(self) -> None:
        """Both ends, whatever happened (a launch that raised)."""
        self._close_write_end()
        self._close_read_end()

    def _close_read_end(self) -> None:
        if self.read_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.read_fd)
            self.read_fd = -1

    def _close_write_end(self) -> None:
        if self.write_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.write_fd)
            self.write_fd = -1


def cover_links(bwrap_pid: int, links: str) -> None:
    """Mount each closed link over itself in the sandbox of ``bwrap_pid`` (protocol/sandbox/link_mounts.py),
    from a process of its own: ``setns`` into a user namespace needs a single thread, and a host has
    many. What Linux refused is logged; the supervisor says so too, and starts the kernel anyway."""
    try:
        with open(f"/proc/{bwrap_pid}/task/{bwrap_pid}/children", encoding="ascii") as f:
            inside = int(f.read().split()[0])  # the sandbox's first process (the supervisor)
    except (OSError, ValueError, IndexError):
        log.warning("ivralo: the sandbox's closed links stay replaceable: its first process cannot be found")
        return
    # By its path, without site (-S): it needs the standard library alone, and the kernel's start waits.
    argv = [sys.executable, "-I", "-S", link_mounts.__file__, str(inside), links]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=LINK_COVER_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("ivralo: the sandbox's closed links stay replaceable: %s", exc)
        return
    if done.returncode != 0:
        log.warning("ivralo: a closed link stays replaceable: %s", printable(done.stderr.strip())[-STDERR_KEPT:])


def _readable(fd: int, deadline: float) -> bool:
    """Whether ``fd`` has something to read (or its end) before ``deadline``: poll, not select, whose
    descriptors stop at 1023 (a host with many kernels open has its new ones above that)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0.0, deadline - time.monotonic()) * 1000))


def _read_to_end(stream: IO[bytes] | None, timeout: float) -> str:
    """What is left on a dead process's pipe (a child of it that still holds the write end: cut short)."""
    if stream is None:
        return ""
    fd = stream.fileno()
    deadline = time.monotonic() + timeout
    data = b""
    while len(data) < 65536:
        if not _readable(fd, deadline):
            break
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")
