"""The terminal: kernel.json's argv run from a person's terminal (a script, an editor's terminal)
must leave no way for code in the kernel to type into that terminal's shell (TIOCSTI, TIOCLINUX).

The test is the person's terminal: a real pty whose shell runs the kernel's argv in the foreground,
then reads commands again (``sh -i``) once the kernel has ended. A cell pushes a command into every
terminal it can find (``/dev/tty``, and each of its descriptors that is a tty: fd 0 here) by ctypes,
and through ``sh`` and a Python child. Judged by the file the pushed command would create, and by
what the pty's reader receives; a command the test itself types is run (the check can fail)."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import shlex
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FALLBACK_KERNEL, wait_until
from jupyter_client.connect import write_connection_file
from jupyter_client.kernelspec import KernelSpecManager
from kernel_helpers import execute, raw_client, shut_down

PUSH = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
line = {line!r}.encode()
said = []
def push(fd, where):
    r = [libc.ioctl(fd, 0x5412, ctypes.c_char_p(bytes([b]))) for b in line]  # TIOCSTI
    said.append(f"{{where}}:{{r[0]}}/{{ctypes.get_errno()}}")
try:
    tty = os.open("/dev/tty", os.O_RDWR)
    push(tty, "/dev/tty")
except OSError as e:
    said.append(f"/dev/tty:{{e.errno}}")
for fd in map(int, os.listdir("/proc/self/fd")):
    with __import__("contextlib").suppress(OSError):
        if os.isatty(fd):
            push(fd, f"fd{{fd}}")
print(os.getpid(), " ".join(said))
"""


class Terminal:
    """A pty with a shell in it, as a person's terminal; everything it shows is kept."""

    def __init__(self, command: str, cwd: Path, env: dict[str, str]) -> None:
        self.pid, self.master = pty.fork()
        if self.pid == 0:  # the child: the terminal's shell
            with contextlib.suppress(BaseException):
                os.chdir(cwd)
                os.execve("/bin/sh", ["sh", "-c", command], env)
            os._exit(127)
        self.shown = b""

    def read_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if ready:
                try:
                    chunk = os.read(self.master, 65536)
                except OSError:
                    return
                if not chunk:
                    return
                self.shown += chunk

    def wait_for(self, text: bytes, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.shown:
            assert time.monotonic() < deadline, f"{text!r} never shown; the terminal showed {self.shown[-2000:]!r}"
            self.read_for(0.1)

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        os.close(self.master)


@pytest.fixture(params=["ivralo", FALLBACK_KERNEL])
def terminal_kernel(request: pytest.FixtureRequest, workspace: Path, tmp_path: Path) -> Iterator[tuple[Terminal, str]]:
    spec = KernelSpecManager().get_kernel_spec(request.param)
    connection_file, _ = write_connection_file(str(tmp_path / "kernel-tty.json"))
    argv = " ".join(shlex.quote(part.format(connection_file=connection_file)) for part in spec.argv)
    env = dict(os.environ, **spec.env, PS1="$ ")
    # The person's shell runs the kernel in the foreground, then takes commands again.
    terminal = Terminal(f"{argv}; echo KERNEL-ENDED; exec sh -i", workspace, env)
    try:
        yield terminal, connection_file
    finally:
        terminal.close()


@pytest.mark.timeout(180)
def test_a_cell_types_nothing_into_the_persons_shell(
    terminal_kernel: tuple[Terminal, str], workspace: Path, tmp_path: Path
) -> None:
    terminal, connection_file = terminal_kernel
    pushed, typed = tmp_path / "pushed-ran", tmp_path / "typed-ran"
    line = f"touch {pushed}\n"
    kc = raw_client(connection_file)
    try:
        kc.wait_for_ready(timeout=60)
        script = PUSH.format(line=line)
        said = execute(kc, script).stdout
        # The same from a Python child of ``sh``, with the terminal as its stdin, and as it is.
        code = f"""
import subprocess, sys
for cmd in (['sh', '-c', 'exec "$0" -c "$1" </dev/tty', sys.executable, {script!r}],
            ['sh', '-c', 'exec "$0" -c "$1"', sys.executable, {script!r}]):
    r = subprocess.run(cmd, capture_output=True, text=True)
    print(r.stdout + r.stderr)
"""
        said += execute(kc, code).stdout
        shut_down(kc, 60)
    finally:
        kc.stop_channels()
    terminal.wait_for(b"KERNEL-ENDED", 60)
    # Typed after anything pushed: once the shell has run this, it has read what was pushed before.
    terminal.type(f"touch {typed}\n")
    wait_until(typed.exists, 30, "the person's shell to run what the person types (the check can fail)")
    terminal.type("exit\n")
    terminal.read_for(30)  # until the shell has gone (EOF)
    assert not pushed.exists(), f"a cell typed a command into the person's shell: {said}\n{terminal.shown[-2000:]!r}"
    assert str(pushed).encode() not in terminal.shown, f"the pushed line reached the terminal: {said}"
    assert "/dev/tty:6" in said, f"the kernel has no controlling terminal (ENXIO): {said}"
