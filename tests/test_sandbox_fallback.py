"""The sandbox's routes again, in the fallback mode (forced here with ``sandbox="off"``; in real use:
no user namespaces, VS Code's raw launch, a container without the privilege). Each test asserts
exactly what this mode stops and what it does not, judged from outside the kernel as in
``test_sandbox.py``: the layers left are the Python guards and Landlock (the write floor, and the
signal and abstract-socket scopes of ABI >= 6)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import FALLBACK_KERNEL, gone, wait_until
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager
from kernel_helpers import execute
from sandbox_cases import SECRET, sh, started_kernel, tcp_and_udp, try_network_routes, try_unix_sockets, unix_servers

from ivralo_kernel.guards.landlock import abi


@contextlib.contextmanager
def fallback_kernel(workspace: Path) -> Iterator[tuple[KernelManager, BlockingKernelClient]]:
    with started_kernel(FALLBACK_KERNEL, workspace) as (manager, client):
        layers = client.kernel_info(reply=True, timeout=30)["content"]["ivralo"]["layers"]
        assert layers["sandbox"].startswith("none (turned off by the host's settings"), layers["sandbox"]
        # Where Landlock has no TCP rule (ABI < 4) the banner says a subprocess can connect anywhere.
        gap = "can connect to any TCP port directly" if abi() < 4 else "can reach the network"
        assert (gap in layers["not_stopped"]) == (abi() < 4), layers["not_stopped"]
        yield manager, client


def test_the_banner_says_there_is_no_sandbox_and_what_is_not_stopped(workspace: Path) -> None:
    with fallback_kernel(workspace) as (_, kc):
        banner = kc.kernel_info(reply=True, timeout=30)["content"]["banner"]
    assert "ivralo: no OS sandbox (turned off by the host's settings (sandbox='off'))" in banner
    assert "Not stopped in this mode: a subprocess or ctypes can " in banner
    assert ("connect to any TCP port directly" in banner) == (abi() < 4), banner


def test_closed_paths_are_closed_to_python_only(workspace: Path) -> None:
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    (workspace / ".ivralo").mkdir()
    with fallback_kernel(workspace) as (_, kc):
        refused = execute(kc, "try:\n    open('.git/config', 'a')\nexcept Exception as e:\n    print(type(e).__name__)")
        sh(kc, "echo evil > .git/hooks/pre-commit; echo '{}' > .ivralo/permissions.json")
    assert refused.stdout == "GuardRefusal\n", "stopped: Python's own open()"
    assert (workspace / ".git" / "hooks" / "pre-commit").read_text() == "evil\n", "not stopped: a shell"
    assert (workspace / ".ivralo" / "permissions.json").exists(), "not stopped: a shell"


def test_dotenv_is_closed_to_python_only(workspace: Path) -> None:
    (workspace / ".env").write_text(f"ACME_API_KEY={SECRET}\n")
    with fallback_kernel(workspace) as (_, kc):
        refused = execute(kc, "try:\n    open('.env').read()\nexcept Exception as e:\n    print(type(e).__name__)")
        sh(kc, "cat .env > leaked.txt")
    assert refused.stdout == "GuardRefusal\n", "stopped: Python's own open()"
    assert SECRET in (workspace / "leaked.txt").read_text(), "not stopped: a shell"


def test_unix_sockets_are_refused_by_seccomp(workspace: Path) -> None:
    with fallback_kernel(workspace) as (_, kc), unix_servers() as (addresses, counters):
        said = try_unix_sockets(kc, addresses)
    tmp, run_user, abstract = (c.hits for c in counters)
    # No new AF_UNIX socket in the kernel's tree (seccomp, once its own sockets are bound), and
    # Landlock's scope (ABI >= 6) stops the abstract ones too.
    assert tmp == 0 and run_user == 0 and abstract == 0, f"stopped: socket files and abstract sockets\n{said}"


def test_network_python_is_judged_the_rest_is_not(workspace: Path) -> None:
    with fallback_kernel(workspace) as (_, kc), tcp_and_udp() as (tcp_port, udp_port, tcp_hits, udp_hits):
        said = try_network_routes(kc, tcp_port, udp_port)
    assert "fastopen gaierror" in said, f"stopped: sendmsg is judged like sendto\n{said}"
    assert "udp PermissionError" in said, f"stopped: the fallback's seccomp filter refuses a UDP socket\n{said}"
    assert udp_hits.hits == 0, said
    # ctypes, curl direct and a python -I child: stopped by Landlock's TCP rule (ABI >= 4), which lets
    # the tree reach the host's egress proxy only; curl through it is refused (nobody to ask).
    assert tcp_hits.hits == (0 if abi() >= 4 else 3), said
    assert f"curl via proxy 0 ivralo refused 127.0.0.1:{tcp_port} (nobody to ask)" in said, said


def test_signals_are_scoped_metadata_is_not(workspace: Path) -> None:
    outside = Path.home() / ".cache" / "ivralo-tests" / uuid.uuid4().hex
    outside.mkdir(parents=True)
    target = outside / "file.txt"
    target.write_text("x")
    os.chmod(target, 0o644)
    victim = subprocess.Popen(["sleep", "300"])
    try:
        with fallback_kernel(workspace) as (_, kc):
            sh(kc, f"kill -TERM {victim.pid}; chmod 777 {target}")
        if abi() >= 6:
            assert victim.poll() is None, "stopped by Landlock's signal scope (ABI >= 6)"
        assert target.stat().st_mode & 0o777 == 0o777, "not stopped: chmod outside (Landlock has no right for it)"
    finally:
        victim.kill()
        victim.wait()
        target.unlink()
        outside.rmdir()


def test_a_setsid_child_outlives_a_killed_supervisor(workspace: Path) -> None:
    """Not stopped in this mode: only a pid namespace ends what left the supervisor's tree."""
    with fallback_kernel(workspace) as (km, kc):
        execute(kc, "import subprocess\nd = subprocess.Popen(['setsid', 'sleep', '304'])")
        supervisor = km.provisioner.supervisor_pid()
        daemon = next(
            p.pid for p in psutil.Process(supervisor).children(recursive=True) if p.cmdline() == ["sleep", "304"]
        )
        os.kill(supervisor, signal.SIGKILL)
        wait_until(lambda: gone(supervisor), 5, "the supervisor to be gone")
        try:
            assert not gone(daemon), "the setsid child survived the supervisor's SIGKILL"
        finally:
            with contextlib.suppress(psutil.Error):
                psutil.Process(daemon).kill()
            wait_until(lambda: gone(daemon), 5, "the leftover child to be reaped")


@pytest.fixture(autouse=True)
def _landlock_is_here() -> None:
    assert abi() >= 1, "these outcomes assume Landlock (Linux >= 5.13), as on this project's machines"
