"""[kernel] The kernel process's entry point. Guards go in before ipykernel is imported.

Order, and why:

1. The workspace is not on ``sys.path`` (``-P``): a user file named ``socket.py`` must not shadow
   a module the guards rely on. It is added back, after the standard library, once the kernel is
   built, the way IPython adds the working directory.
2. No bytecode is written, by this process or by Python processes it starts.
3. The policy is read (the host's policy file, or the kernelspec's ``IVRALO_*`` variables).
4. Limits are applied while the process is still small and single-threaded.
5. Credentials leave ``os.environ``; the workspace ``.env`` is loaded; they leave it again.
6. Only then is ipykernel imported and the kernel built.

Each stage is reported to the supervisor; a failure is written to ``.ivralo/python-worker.log``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from ivralo_kernel.guards import apply_limits, scrub_environ
from ivralo_kernel.kernel.launch_state import STATE
from ivralo_kernel.kernel.stages import SupervisorPipe, write_failure
from ivralo_kernel.protocol import KernelPolicy, default_memory_limit, names


def _load_dotenv(workspace: str) -> bool:
    path = os.path.join(workspace, names.DOTENV_FILE)
    if not os.path.isfile(path):
        return False
    from dotenv import load_dotenv  # only paid for when there is a .env

    # override=False: what the host set wins over the file, as in every dotenv tool.
    return load_dotenv(path, override=False, interpolate=True)


def _add_workspace_to_path() -> None:
    """Put the working directory on sys.path after the standard library, as IPython does."""
    if "" in sys.path:
        return
    for index, entry in enumerate(sys.path):
        if os.path.basename(entry) in {"site-packages", "dist-packages"}:
            sys.path.insert(index, "")
            return
    sys.path.append("")


def _build_app() -> Any:
    from ipykernel.kernelapp import IPKernelApp

    from ivralo_kernel.kernel.kernel import IvraloKernel

    app = IPKernelApp.instance(kernel_class=IvraloKernel)
    app.initialize(sys.argv[1:])
    return app


def main() -> None:
    reporter = SupervisorPipe(os.environ)
    STATE.started_at = float(os.environ.pop(names.ENV_LAUNCHED_AT, "") or time.time())
    sys.dont_write_bytecode = True  # step 2
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    reporter.reached_stage(names.STAGE_INTERPRETER_UP)
    workspace = os.getcwd()
    try:
        policy = KernelPolicy.from_env(os.environ, workspace)  # step 3
        workspace = os.path.realpath(policy.workspace)
        os.chdir(workspace)
        os.environ[names.ENV_WORKSPACE] = workspace
        limits = apply_limits(policy.memory_limit_bytes or default_memory_limit(), policy.rlimit_nofile)  # 4
        reporter.reached_stage(names.STAGE_LIMITS_APPLIED)

        removed, problems = scrub_environ(workspace)  # step 5
        if _load_dotenv(workspace):
            removed += scrub_environ(workspace)[0]
        STATE.workspace, STATE.role, STATE.policy, STATE.pipe = workspace, policy.role, policy, reporter
        STATE.scrubbed = sorted(set(removed))
        STATE.notes += problems
        STATE.layers = {
            "supervisor": bool(os.environ.get(names.ENV_SUPERVISOR_PID)),
            "env_scrub": True,
            "memory_cap": "RLIMIT_DATA",
            "memory_limit_bytes": limits.memory_limit_bytes,
            "rlimit_nofile": limits.rlimit_nofile,
            "core_dumps": False,
            "dumpable": limits.dumpable,
            "bytecode_written": False,
        }
        reporter.reached_stage(names.STAGE_GUARDS_INSTALLED)

        app = _build_app()  # step 6
        _add_workspace_to_path()  # step 1, second half
        STATE.bootstrap_ms = round((time.time() - STATE.started_at) * 1000, 1)
        reporter.reached_stage(names.STAGE_KERNEL_BUILT)
    except BaseException as exc:  # noqa: BLE001 - whatever stops the start is written to the log first
        try:
            where = f"details in {write_failure(workspace, reporter.reached, exc)}"
        except OSError as log_error:
            where = f"the log could not be written: {log_error}"
        print(f"ivralo kernel failed to start: {exc!r} ({where})", file=sys.stderr)
        raise SystemExit(1) from None
    app.start()
