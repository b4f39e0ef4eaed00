"""[host] ``SandboxLaunch``: how one kernel was launched, and the host's hands on its process tree.

The supervisor is found inside the sandbox (bwrap's processes come first), signalled for an
interrupt or an end, and given the deadline backstop's lines on the host's pipe; the tree is ended
through it, and what it leaves is SIGKILLed. jupyter_client's own ``kill`` SIGKILLs the process
group, which kills the supervisor before it can clean up and leaves ``setsid`` children behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil

from ivralo_kernel.host.jupyter.kernelspec import SUPERVISOR_MODULE
from ivralo_kernel.host.watch.processes import find_in_tree, host_pid
from ivralo_kernel.protocol.pipe import KillAt
from ivralo_kernel.protocol.pipe import encode as encode_line

if TYPE_CHECKING:
    from ivralo_kernel.host.sandbox.launch import SandboxFolder
    from ivralo_kernel.host.sandbox.memory_cgroup import KernelCgroup

# How long the supervisor gets to end the tree after being asked, before we SIGKILL what we see.
SUPERVISOR_KILL_BUDGET_S = 3.0
SIGNAL_KILL_NOW = signal.SIGUSR1  # the supervisor's "kill the tree now" (see supervisor.run)
Process = subprocess.Popen[bytes] | None


@dataclass
class SandboxLaunch:
    """How the kernel was launched, and the host's handles on its tree."""

    sandboxed: bool = False  # the running kernel lives in a bwrap sandbox
    sandbox_reason: str = ""  # why not, when it does not
    launch_args: tuple[list[str], dict[str, Any]] | None = None  # the command and Popen options (a replacement's)
    folder: SandboxFolder | None = None  # its run folder: ipc sockets, the proxy's socket, the seccomp filter
    supervisor: int | None = None  # the supervisor's pid, as the host sees it
    supervisor_process: psutil.Process | None = None  # the same, kept to end it if bwrap dies first
    host_pipe: tuple[int, int] | None = None  # the sandbox's supervisor sees EOF when this process is gone
    # The tree's memory cgroup (host/sandbox/memory_cgroup.py), made before the first launch and kept for
    # restarts and replacements (a spare's goes with its resources to the adopter); None without one.
    cgroup: KernelCgroup | None = None
    cgroup_report: str = ""  # which memory limit the Linux kernel enforces, or why none (banner, doctor)
    bwrap: str = ""  # the bwrap of this launch, named in its failures (the command starts with the cgroup's sh)

    def in_cgroup(self, cmd: list[str]) -> list[str]:
        """``cmd``, joining the kernel's cgroup before it runs a line (unchanged without one)."""
        return cmd if self.cgroup is None else self.cgroup.join_command(cmd)

    def close(self) -> None:
        if self.cgroup is not None:  # after the tree: what is left in it (a setsid child) is killed first
            if not self.cgroup.remove():
                logging.getLogger(__name__).warning(
                    "ivralo: the kernel's memory cgroup %s could not be removed", self.cgroup.path
                )
            self.cgroup = None
        if self.folder is not None:
            self.folder.remove()
            self.folder = None
        if self.host_pipe is not None:
            for fd in self.host_pipe:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.host_pipe = None

    def supervisor_pid(self, process: Process) -> int | None:
        """The supervisor's pid, as the host sees it (inside a sandbox, bwrap's processes come first)."""
        if process is None:
            return None
        if not self.sandboxed:
            return int(process.pid)
        if self.supervisor is None:
            self.supervisor = find_in_tree(process.pid, SUPERVISOR_MODULE)
            if self.supervisor is not None:
                with contextlib.suppress(psutil.Error):
                    self.supervisor_process = psutil.Process(self.supervisor)
        return self.supervisor

    def host_pid(self, process: Process, kernel_pid: int) -> int:
        """The host's pid of the kernel that reports ``kernel_pid`` (its pid in the sandbox)."""
        if not self.sandboxed or process is None:
            return kernel_pid
        return host_pid(process.pid, kernel_pid) or kernel_pid

    def backstop_line(self, execution: str, kill_at: float | None) -> None:
        """(watchdog thread) Arm or disarm the supervisor's backstop for one execution."""
        pipe = self.host_pipe
        if pipe is None:
            return
        with contextlib.suppress(OSError):  # full (a wedged supervisor) or closed: the watchdog still acts
            os.write(pipe[1], encode_line(KillAt(execution, kill_at)))

    def interrupt(self, process: Process) -> None:
        """(watchdog thread) SIGINT to the supervisor, which passes it on to the kernel's group."""
        if process is None:
            return
        if self.sandboxed:
            supervisor = self.supervisor_pid(process)
            if supervisor is not None:
                os.kill(supervisor, signal.SIGINT)
            return
        os.killpg(process.pid, signal.SIGINT)

    def kill_tree(self, process: Process) -> None:
        """End the kernel's whole tree, from any thread: ask the supervisor, then SIGKILL what is left."""
        if process is None:
            return
        if process.poll() is not None:
            # bwrap is gone; a supervisor we saw may not be (bwrap killed from outside): out of our
            # tree now, it still holds the sandbox. psutil checks it is the same process.
            orphan = self.supervisor_process
            if orphan is not None:
                with contextlib.suppress(psutil.Error):
                    for proc in [*orphan.children(recursive=True), orphan]:
                        proc.kill()
            if self.cgroup is not None:
                self.cgroup.kill_all()
            return
        tree = _tree_snapshot(process)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.supervisor_pid(process) or process.pid, SIGNAL_KILL_NOW)
        deadline = time.monotonic() + SUPERVISOR_KILL_BUDGET_S
        while process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        for proc in [*_tree_snapshot(process), *tree]:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        if process.poll() is None:
            with contextlib.suppress(OSError):
                process.kill()
        if self.cgroup is not None:  # what left the tree (setsid, an orphan) never leaves its cgroup
            self.cgroup.kill_all()


def _tree_snapshot(process: Any) -> list[psutil.Process]:
    try:
        root = psutil.Process(process.pid)
        return [*root.children(recursive=True), root]
    except psutil.Error:
        return []


def discard(process: subprocess.Popen[bytes] | None) -> None:
    """A bwrap that did not build the sandbox: reaped, its pipes closed (it wrote what it had to say)."""
    if process is None:
        return
    with contextlib.suppress(OSError):
        process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=SUPERVISOR_KILL_BUDGET_S)
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            stream.close()
