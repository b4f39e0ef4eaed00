"""[host] One kernel's sandbox on disk, and the command that starts the kernel in it.

Shared by the two hosts that build sandboxes: ``IvraloProvisioner`` (every jupyter_client host) and
the raw launch (``raw_launch``: VS Code runs kernel.json's argv itself). Each kernel gets a short
private folder, ``/tmp/ivralo-XXXX``: ``run/`` holds its Jupyter sockets (``ipc``) and the egress
proxy's socket, and is the only folder the sandbox shares with the host; ``empty`` is the file
mounted over each ``.env``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

from ivralo_kernel.host.closed_paths import WorkspaceClaim
from ivralo_kernel.host.sandbox import SandboxPlan, prepare_workspace
from ivralo_kernel.protocol import names

PROXY_URL = f"http://127.0.0.1:{names.RELAY_PORT}"
CHANNELS = ("shell", "iopub", "stdin", "control", "hb")
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


@dataclass(frozen=True)
class SandboxFolder:
    root: str
    # This kernel's hold on each workspace's placeholders, given up when the folder is removed (the
    # kernel has ended by then, and the last one out removes them).
    claims: dict[str, WorkspaceClaim] = field(default_factory=dict, compare=False, hash=False)

    @classmethod
    def create(cls) -> SandboxFolder:
        root = tempfile.mkdtemp(prefix="ivralo-")  # short: a socket's sun_path holds 107 bytes
        os.makedirs(os.path.join(root, "run"), mode=0o700)
        folder = cls(root)
        with open(folder.empty_file, "w", encoding="utf-8"):
            pass
        os.chmod(folder.empty_file, 0o444)
        return folder

    @property
    def run_dir(self) -> str:
        return os.path.join(self.root, "run")

    @property
    def empty_file(self) -> str:
        return os.path.join(self.root, "empty")

    @property
    def kernel_ip(self) -> str:
        """The ``ip`` of an ``ipc`` connection: socket files ``run/kernel-<port>``."""
        return os.path.join(self.run_dir, "kernel")

    @property
    def egress_socket(self) -> str:
        return os.path.join(self.run_dir, "egress.sock")

    def clear_kernel_sockets(self) -> None:
        """A dead kernel's socket files: a new kernel binds the same (one still closing holds them)."""
        for number in range(1, len(CHANNELS) + 1):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.kernel_ip}-{number}")

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        while self.claims:
            self.claims.popitem()[1].release()


def kernel_connection(client: dict[str, Any], folder: SandboxFolder) -> tuple[str, dict[str, Any]]:
    """The kernel's connection file: the client's key, ``ipc`` sockets in the run folder (read-only
    inside; the kernel finds every port given and writes nothing)."""
    info = {k: v for k, v in client.items() if k not in (f"{c}_port" for c in CHANNELS)}
    info |= {"transport": "ipc", "ip": folder.kernel_ip}
    info |= {f"{channel}_port": number for number, channel in enumerate(CHANNELS, start=1)}
    path = os.path.join(folder.root, "connection.json")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a restart: written again (read-only, so not opened for writing)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(info, f)
    os.chmod(path, 0o400)
    return path, info


def sandboxed_command(
    bwrap: str,
    folder: SandboxFolder,
    workspace: str,
    cmd: list[str],
    env: dict[str, str],
    *,
    read_only_files: tuple[str, ...],
    tool_files: tuple[str, ...],
    jupyter_runtime_dir: str | None,
    credential_stores: tuple[str, ...] = (),
    exchange_dir: str = "",
) -> list[str]:
    """``cmd`` wrapped in bwrap; ``env`` gains what the kernel needs inside (its way out)."""
    prepare_workspace(workspace)
    env[names.ENV_SANDBOX] = names.SANDBOX_BWRAP
    env[names.ENV_EGRESS_SOCKET] = folder.egress_socket
    env[names.ENV_RELAY_PORT] = str(names.RELAY_PORT)
    env.update(dict.fromkeys(PROXY_VARIABLES, PROXY_URL))
    env["NO_PROXY"] = env["no_proxy"] = ""  # localhost too: the relay knows which one is meant
    plan = SandboxPlan(
        bwrap=bwrap,
        workspace=workspace,
        run_dir=folder.run_dir,
        empty_file=folder.empty_file,
        read_only_files=read_only_files,
        tool_files=tool_files,
        env=env,
        jupyter_runtime_dir=jupyter_runtime_dir,
        scratch_overlays=(_ipython_dir(env),),
        code_trees=_code_trees(cmd[0]),
        credential_store_paths=credential_stores,
        exchange_dir=exchange_dir,
    )
    # Each missing closed path gets its placeholder now, on the host, so that argv mounts it read-only.
    claim = folder.claims.get(workspace) or folder.claims.setdefault(workspace, WorkspaceClaim(workspace))
    claim.hold(plan.missing())
    claim.note_links(plan.closed_links())  # a replaced one is named in the host's log when the kernel ends
    return plan.argv(cmd)


def _code_trees(python: str) -> tuple[str, ...]:
    """Where the kernel's interpreter and ivralo's own code live (a venv's root, the interpreter it
    points to, an editable checkout)."""
    import ivralo_kernel

    roots = [os.path.dirname(os.path.dirname(os.path.abspath(python)))]
    roots.append(os.path.dirname(os.path.dirname(os.path.realpath(python))))
    package = os.path.dirname(os.path.abspath(ivralo_kernel.__file__))
    # The package itself too: an editable checkout that is the workspace keeps its host code closed.
    roots += [sys.prefix, sys.base_prefix, os.path.dirname(package), package]
    return tuple(roots)


def _ipython_dir(env: dict[str, str]) -> str:
    """IPython's folder, made if missing (IPython would make it on first use; inside the sandbox the
    root is read-only, so it must exist before)."""
    path = env.get("IPYTHONDIR") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".ipython")
    with contextlib.suppress(OSError):
        os.makedirs(path, exist_ok=True)
    return path
