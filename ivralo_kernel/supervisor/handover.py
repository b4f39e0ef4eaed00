"""[supervisor] A launch with no host goes to the raw launch's host, before anything else loads.

VS Code runs kernel.json's argv itself: no provisioner built a sandbox or wrote a policy file. The
raw launch's host (``names.RAW_LAUNCH_MODULE``) builds the OS sandbox and relays the client's TCP
ports into it. Handed over by exec, so the client's signals still reach the pid it started; and
first thing, so the start pays for no import of ours it will not use.
"""

from __future__ import annotations

import os
import sys

from ivralo_kernel.protocol import KernelPolicy, database_env_names, names, scrub
from ivralo_kernel.protocol.bootstrap import module_argv


def hand_over_a_raw_launch(args: list[str]) -> None:
    """Returns when a host started us (it said how: ``IVRALO_SANDBOX``); otherwise becomes the raw
    launch's host (which also reads ``.env`` for the kernel, with the sandbox turned off too)."""
    if names.ENV_SANDBOX in os.environ or names.ENV_POLICY_FILE in os.environ:
        return
    # Without the credentials: /proc/<pid>/environ keeps the block a process was started with, and
    # this pid is the one VS Code started, with its whole environment.
    workspace = KernelPolicy.from_env(os.environ, os.getcwd()).workspace
    db_names, _ = database_env_names(workspace, os.environ)
    clean, _ = scrub(os.environ, db_names)
    argv = module_argv(sys.executable, names.RAW_LAUNCH_MODULE, args, env=clean)
    os.execve(argv[0], argv, clean)  # noqa: S606 - our own module, no shell
