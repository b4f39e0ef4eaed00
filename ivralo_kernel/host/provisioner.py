"""[host] ``IvraloProvisioner``: the host side of every ivralo kernel that jupyter_client starts.

jupyter_server (JupyterLab), ``jupyter console``, nbclient and agents all pick it up from
``kernel.json``. It scrubs credentials from the environment before exec, writes the launch policy
to a read-only file, and ends kernels through the supervisor so that the whole tree goes:
jupyter_client's own ``kill`` SIGKILLs the process group, which kills the supervisor before it
can clean up and leaves ``setsid`` children behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
import tempfile
import time
from typing import Any

import psutil
from jupyter_client.provisioning.local_provisioner import LocalProvisioner
from traitlets import Int, Unicode, validate

from ivralo_kernel.protocol import KernelPolicy, database_env_names, names, scrub

# How long the supervisor gets to end the tree after being asked, before we SIGKILL what we see.
SUPERVISOR_KILL_BUDGET_S = 3.0
SIGNAL_KILL_NOW = signal.SIGUSR1  # the supervisor's "kill the tree now" (see supervisor.run)


class IvraloProvisioner(LocalProvisioner):  # type: ignore[misc]
    workspace = Unicode(
        "",
        config=True,
        help="Folder the kernel runs in and may write to. Empty: the folder the host starts the "
        "kernel in (for JupyterLab, the notebook's folder).",
    )
    role = Unicode(names.ROLE_SPECIALIST, config=True, help="specialist, or readonly (every write refused).")
    memory_limit_bytes = Int(
        0,
        config=True,
        help="RLIMIT_DATA of the kernel, in bytes: a larger allocation raises MemoryError in the "
        "cell. 0: half of the machine's memory.",
    )
    rlimit_nofile = Int(0, config=True, help="RLIMIT_NOFILE of the kernel. 0: leave the inherited limit.")

    policy_file: str | None = None

    @validate("role")
    def _valid_role(self, proposal: Any) -> str:
        KernelPolicy(workspace="/", role=proposal["value"])  # raises ConfigError naming the fix
        return str(proposal["value"])

    def policy_for(self, cwd: str) -> KernelPolicy:
        return KernelPolicy(
            workspace=os.path.realpath(self.workspace or cwd),
            role=self.role,
            memory_limit_bytes=self.memory_limit_bytes or None,
            rlimit_nofile=self.rlimit_nofile or None,
        )

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        kwargs = await super().pre_launch(**kwargs)
        policy = self.policy_for(str(kwargs.get("cwd") or os.getcwd()))
        db_names, problems = database_env_names(policy.workspace, kwargs["env"])
        env, removed = scrub(kwargs["env"], db_names)
        for problem in problems:
            self.log.warning("ivralo: %s", problem)
        if removed:  # names only: values never reach a log
            self.log.info(
                "ivralo: kept %d credential variable(s) out of the kernel: %s", len(removed), ", ".join(removed)
            )
        self.policy_file = self._write_policy(policy)
        env[names.ENV_POLICY_FILE] = self.policy_file
        env[names.ENV_WORKSPACE] = policy.workspace
        kwargs["env"] = env
        kwargs["cwd"] = policy.workspace
        return kwargs

    def _write_policy(self, policy: KernelPolicy) -> str:
        # Beside the connection file, in the runtime dir: private to the user, cleaned with the kernel.
        runtime = os.path.dirname(str(getattr(self.parent, "connection_file", "") or "")) or None
        if runtime and not os.path.isdir(runtime):
            runtime = None
        fd, path = tempfile.mkstemp(prefix="ivralo-policy-", suffix=".json", dir=runtime)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(policy.to_json())
        os.chmod(path, stat.S_IRUSR)  # the kernel reads it; nothing should rewrite it
        return path

    async def kill(self, restart: bool = False) -> None:
        """End the kernel's whole tree: ask the supervisor, then SIGKILL whatever is left."""
        if not self.process or self.process.poll() is not None:
            return
        tree = self._tree_snapshot()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, SIGNAL_KILL_NOW)
        deadline = time.monotonic() + SUPERVISOR_KILL_BUDGET_S
        while self.process.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for proc in [*self._tree_snapshot(), *tree]:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        if self.process.poll() is None:
            await super().kill(restart)

    async def terminate(self, restart: bool = False) -> None:
        """Graceful stop: SIGTERM to the supervisor, which forwards it and then ends the tree."""
        if self.process and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGTERM)

    async def send_signal(self, signum: int) -> None:
        if signum == signal.SIGKILL:
            await self.kill()
            return
        await super().send_signal(signum)

    def _tree_snapshot(self) -> list[psutil.Process]:
        if not self.process:
            return []
        try:
            root = psutil.Process(self.process.pid)
            return [*root.children(recursive=True), root]
        except psutil.Error:
            return []

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart)
        if self.policy_file:
            with contextlib.suppress(OSError):
                os.unlink(self.policy_file)
            self.policy_file = None
