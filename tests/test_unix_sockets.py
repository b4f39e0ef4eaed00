"""No unix socket of the machine is reachable from the kernel's tree, wherever it lives: a listener
in a folder the sandbox shows (here the workspace itself, which is always visible) and a real tmux
server there, tried from Python, ctypes, ``sh`` (a Python child, curl) and ``tmux``; judged by the
listener's accept count and by a file the tmux server would create outside the sandbox."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FALLBACK_KERNEL, SANDBOXED_KERNEL, wait_until
from kernel_helpers import execute
from sandbox_cases import Counter, sh, started_kernel

MODES = (SANDBOXED_KERNEL, FALLBACK_KERNEL)

CTYPES_CONNECT = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
path = {path!r}.encode()
fd = libc.socket(1, 1, 0)
addr = ctypes.create_string_buffer(110)
addr[0:2] = (1).to_bytes(2, "little")
addr[2 : 2 + len(path)] = path
r = libc.connect(fd, addr, 2 + len(path) + 1) if fd >= 0 else -1
print("ctypes", fd, r, ctypes.get_errno())
"""
PY_CONNECT = "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); print('connected')"


@pytest.fixture
def listener(workspace: Path) -> Iterator[tuple[str, Counter]]:
    """A unix socket server in the workspace (visible inside in every mode), counting accepts."""
    folder = workspace / "agent-sock"
    folder.mkdir()
    path = str(folder / "s")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    counter = Counter()
    counter.serve(server)
    try:
        yield path, counter
    finally:
        counter.close()
        server.close()


@pytest.fixture
def datagram_listener(workspace: Path) -> Iterator[tuple[str, Counter]]:
    """A datagram unix socket in the workspace (as syslog's and journald's are), counting datagrams."""
    path = str(workspace / "dgram.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    counter = Counter()
    counter.serve(server, datagram=True)
    try:
        yield path, counter
    finally:
        counter.close()
        server.close()


# A datagram pair needs no socket(): each end can sendto() any datagram socket by its path.
DATAGRAM_SEND = (
    "import socket, sys\n"
    "for make in (lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM),\n"
    "             lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)[0]):\n"
    "    try:\n"
    "        make().sendto(b'x', sys.argv[1]); print('sent')\n"
    "    except OSError as e:\n"
    "        print(type(e).__name__, e.errno)\n"
)


@pytest.mark.parametrize("kernel_name", MODES)
@pytest.mark.timeout(120)
def test_a_datagram_socket_gets_nothing(
    kernel_name: str, workspace: Path, datagram_listener: tuple[str, Counter]
) -> None:
    path, counter = datagram_listener
    with started_kernel(kernel_name, workspace) as (_, kc):
        said = execute(kc, DATAGRAM_SEND.replace("sys.argv[1]", repr(path))).stdout
        said += sh(kc, f"python3 -I -c {shlex.quote(DATAGRAM_SEND)} {shlex.quote(path)}")
    counter.close()
    assert counter.hits == 0, f"a datagram reached a unix socket in the workspace:\n{said}"
    assert said.count("PermissionError 1") == 4, said


@pytest.mark.parametrize("kernel_name", MODES)
@pytest.mark.timeout(120)
def test_a_socket_in_a_visible_folder_cannot_be_reached(
    kernel_name: str, workspace: Path, listener: tuple[str, Counter]
) -> None:
    path, counter = listener
    with started_kernel(kernel_name, workspace) as (_, kc):
        said = execute(kc, f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({path!r})").stdout
        said += execute(kc, CTYPES_CONNECT.format(path=path)).stdout
        said += sh(kc, f"python3 -I -c {shlex.quote(PY_CONNECT)} {shlex.quote(path)}")
        if shutil.which("curl"):
            said += sh(kc, f"curl -sS --max-time 5 --unix-socket {shlex.quote(path)} http://x/")
        # The kernel's own channels still work after all of that.
        assert execute(kc, "print(1 + 1)").stdout == "2\n"
    counter.close()
    assert counter.hits == 0, f"a unix socket in the workspace was reached:\n{said}"


@pytest.fixture
def tmux_server(workspace: Path, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """The person's tmux server, its socket in a folder the sandbox shows (``TMUX_TMPDIR``)."""
    if not shutil.which("tmux"):
        pytest.skip("tmux is not installed")
    tmpdir = workspace / "tmux"
    tmpdir.mkdir()
    env = {**os.environ, "TMUX_TMPDIR": str(tmpdir)}
    env.pop("TMUX", None)
    session = f"ivralo-{uuid.uuid4().hex[:6]}"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "sleep 120"], env=env, check=True, timeout=30)
    try:
        yield str(tmpdir), tmp_path / "tmux-ran-this"
    finally:
        subprocess.run(["tmux", "kill-server"], env=env, timeout=30, check=False)


@pytest.mark.parametrize("kernel_name", MODES)
@pytest.mark.timeout(120)
def test_tmux_run_shell_runs_nothing_outside(kernel_name: str, workspace: Path, tmux_server: tuple[str, Path]) -> None:
    tmpdir, marker = tmux_server
    line = f"TMUX_TMPDIR={shlex.quote(tmpdir)} tmux run-shell {shlex.quote('touch ' + str(marker))}; echo rc=$?"
    with started_kernel(kernel_name, workspace) as (_, kc):
        said = sh(kc, line)
    assert not marker.exists(), f"tmux ran a command outside the kernel's sandbox: {said}"
    # The same line from the test, outside: the server is alive and runs it (the check can fail).
    env = {**os.environ, "TMUX_TMPDIR": tmpdir}
    env.pop("TMUX", None)
    subprocess.run(["tmux", "run-shell", f"touch {marker}"], env=env, check=True, timeout=30)
    wait_until(marker.exists, 10, "the person's own tmux runs the command (the server is alive)")


@pytest.mark.timeout(180)
def test_a_restarted_sandboxed_kernel_serves_its_channels(workspace: Path) -> None:
    """The filter goes in after the kernel's own sockets are bound, on each start."""
    with started_kernel(SANDBOXED_KERNEL, workspace) as (km, kc):
        assert execute(kc, "x = 1\nprint(x)").stdout == "1\n"
        km.restart_kernel(now=True)
        kc.wait_for_ready(timeout=60)
        layers = kc.kernel_info(reply=True, timeout=30)["content"]["ivralo"]["layers"]
        assert layers["unix_sockets"] == "closed: no new AF_UNIX socket (seccomp, every thread and every child)", layers
        assert execute(kc, "print(2 + 2)").stdout == "4\n"
