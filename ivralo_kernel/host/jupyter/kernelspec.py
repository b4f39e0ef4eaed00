"""[host] The ``ivralo`` kernelspec, produced by a function so that install and Session agree.

The interpreter in argv is absolute: jupyter_client replaces a bare ``python`` with the *host's*
interpreter, and VS Code runs argv as written. ``-P`` keeps the workspace (the kernel's working
directory) off ``sys.path`` while our own modules load; ``-B`` writes no bytecode.
"""

from __future__ import annotations

import sys
from typing import Any

from ivralo_kernel.host.settings.launch_settings import raw_launch_env
from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.bootstrap import module_argv

SUPERVISOR_MODULE = "ivralo_kernel.supervisor"


def kernel_argv(python: str | None = None, private_path: bool = False) -> list[str]:
    """``private_path``: the interpreter lacks ivralo, which comes from ``IVRALO_CODE_PATH`` (in the
    spec's env), appended after its own site-packages by ``protocol.bootstrap``."""
    args = ["-f", "{connection_file}"]
    return module_argv(python or sys.executable, SUPERVISOR_MODULE, args, private_path=private_path)


# A raw launch (VS Code runs argv itself) reads no provisioner config, only kernel.json's env: the
# settings the kernel and its supervisor enforce by themselves travel there too.
def kernel_spec_dict(
    python: str | None = None,
    display_name: str = names.DISPLAY_NAME,
    provisioner_config: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The content of ``kernel.json``."""
    env = {**raw_launch_env(provisioner_config or {}), **(env or {})}
    return {
        "argv": kernel_argv(python, private_path=bool(env.get(names.ENV_CODE_PATH))),
        "display_name": display_name,
        "language": "python",
        # jupyter_client signals the supervisor's group, VS Code its pid: it passes SIGINT on, once.
        "interrupt_mode": "signal",
        "env": env,
        "kernel_protocol_version": "5.5",
        "metadata": {
            # JupyterLab shows its debugger, and VS Code its Debug Cell and Run by Line, for kernels
            # that say so; the kernel's own loopback links (debugpy's) are not judged by its guards.
            "debugger": True,
            "kernel_provisioner": {
                "provisioner_name": names.PROVISIONER_NAME,
                "config": dict(provisioner_config or {}),
            },
        },
    }


# A small logo for JupyterLab's launcher card (it prefers logo-svg).
LOGO_SVG = """<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 64 64" width="64" height="64">
<rect x="2" y="2" width="60" height="60" rx="12" fill="#1f4e79"/>
<path d="M32 10 L50 17 V31 C50 43 42 51 32 55 C22 51 14 43 14 31 V17 Z" fill="#ffd43b"/>
<text x="32" y="41" font-family="sans-serif" font-size="22" font-weight="bold" text-anchor="middle"
 fill="#1f4e79">iv</text>
</svg>
"""
