"""A container as JupyterLab mostly runs in, emulated without privileges: the seccomp filter of
Docker's default profile (and Kubernetes' RuntimeDefault) for a container without CAP_SYS_ADMIN,
installed on a host process that a test starts; every child inherits it.

``python tests/container.py PROFILE -- ARGV...`` installs the profile's filter, then execs ARGV.

* ``docker-default``: new namespaces, mounts and ``setns`` refused (EPERM), ``clone3`` ENOSYS (as
  Docker does, so glibc falls back to ``clone``), and the syscalls Docker's profile refuses to every
  container (keyctl, bpf, perf_event_open, userfaultfd). bwrap says "No permissions to creating new
  namespace" there, so the kernel runs in its fallback.
* ``docker-userns``: the same container with the settings docs/remote.md gives for the full sandbox
  (a seccomp profile that allows user namespaces and mount): only the syscalls every profile refuses.

``run(profile, argv, ...)`` is the same from a test: a completed process, its output captured.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

HERE = Path(__file__).resolve()
PROFILES = ("docker-default", "docker-userns")
# Refused by Docker's default profile to every container, whatever its capabilities.
ALWAYS_REFUSED = ("keyctl", "add_key", "request_key", "bpf", "perf_event_open", "userfaultfd")
# Refused without CAP_SYS_ADMIN: what building a sandbox needs.
NAMESPACE_CALLS = ("unshare", "setns", "mount", "umount2", "pivot_root", "open_tree", "move_mount", "fsopen")
NAMESPACE_CALLS += ("fsmount", "fsconfig", "fspick")
CLONE_NEW_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)


def install(profile: str) -> None:
    """Load ``profile``'s filter on this process (irreversible; children inherit it)."""
    import pyseccomp as sc  # the test extra: ctypes over the system's libseccomp2

    if profile not in PROFILES:
        raise SystemExit(f"unknown container profile {profile!r}: one of {', '.join(PROFILES)}")
    f = sc.SyscallFilter(defaction=sc.ALLOW)
    for name in ALWAYS_REFUSED:
        f.add_rule(sc.ERRNO(errno.EPERM), name)
    if profile == "docker-default":
        for name in NAMESPACE_CALLS:
            f.add_rule(sc.ERRNO(errno.EPERM), name)
        for flag in CLONE_NEW_FLAGS:
            f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
        f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    f.load()


def command(profile: str, argv: Sequence[str]) -> list[str]:
    """``argv`` run under ``profile``'s filter."""
    return [sys.executable, str(HERE), profile, "--", *argv]


def run(
    profile: str,
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to its end under ``profile`` (a timeout kills it and raises)."""
    return subprocess.run(
        command(profile, argv),
        env=dict(env if env is not None else os.environ),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) < 3 or args[1] != "--":
        raise SystemExit(f"usage: {sys.argv[0]} PROFILE -- ARGV...")
    install(args[0])
    os.execvp(args[2], args[2:])
