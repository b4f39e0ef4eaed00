"""Host death (issue 30, Must 6): a JupyterLab server (jupyter_server, with a warm spare), a
``jupyter console`` and an agent host (a WorkerPool with a prewarmed spare), each SIGKILLed with no
chance to clean up, leave no kernel, spare, supervisor or sandbox running. Judged from the process
table: every process under the host just before the kill is gone soon after. (The egress proxy and
the channel relay are threads of the host; the sandbox's relay is the supervisor's thread.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pexpect
import psutil
import pytest
from conftest import gone, wait_until
from console import JUPYTER
from servers import jupyter_server_process
from test_prewarm import spec  # noqa: F401 - the kernelspec with spares=1

KERNEL_MODULE = "ivralo_kernel.kernel"
GONE_WITHIN_S = 10


def kernels_under(pid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.Process(pid).children(recursive=True):
        try:
            if KERNEL_MODULE in proc.cmdline():
                found.append(proc)
        except psutil.Error:
            continue
    return found


def tree_of(pid: int) -> list[int]:
    return [p.pid for p in psutil.Process(pid).children(recursive=True)]


def kill_and_judge(host: int, kernels: int) -> None:
    """Wait for ``kernels`` kernel processes under ``host``, SIGKILL it, and wait for its whole tree."""
    wait_until(lambda: len(kernels_under(host)) >= kernels, 90, f"{kernels} kernel(s) under the host")
    tree = tree_of(host)
    os.kill(host, signal.SIGKILL)
    for pid in tree:
        wait_until(lambda pid=pid: gone(pid), GONE_WITHIN_S, f"pid {pid} of the killed host's tree to be gone")


@pytest.mark.timeout(150)
def test_a_killed_jupyter_server_leaves_no_kernel_and_no_spare(tmp_path: Path, spec: str) -> None:  # noqa: F811
    root = tmp_path / "root"
    root.mkdir()
    token = uuid.uuid4().hex
    with jupyter_server_process("jupyter_server", root, token) as (url, server):
        body = json.dumps({"name": spec, "path": ""}).encode()
        request = urllib.request.Request(
            f"{url}/api/kernels", data=body, method="POST",
            headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 201
        kill_and_judge(server.pid, kernels=2)  # the notebook's kernel and the spare filled after it
        server.wait(10)


@pytest.mark.timeout(120)
def test_a_killed_console_leaves_no_kernel(workspace: Path) -> None:
    child = pexpect.spawn(
        str(JUPYTER), ["console", "--kernel", "ivralo", "--simple-prompt"],
        cwd=str(workspace), env=dict(os.environ, TERM="dumb"), encoding="utf-8", timeout=60,
    )  # fmt: skip
    try:
        child.expect(r"In \[1\]: ")
        kill_and_judge(child.pid, kernels=1)
    finally:
        child.close(force=True)


AGENT_HOST = """
import asyncio, sys
from ivralo_kernel.host import Session, WorkerConfig, WorkerPool

async def main():
    async with WorkerPool(sys.argv[1], config=WorkerConfig(prewarm_pool_size=1)) as pool:
        async with Session(pool=pool) as session:
            assert await session.run("1") == "1\\n"
            await pool.wait_prewarmed()
            print("ready", flush=True)
            await asyncio.Event().wait()  # until killed

asyncio.run(main())
"""


@pytest.mark.timeout(120)
def test_a_killed_agent_host_leaves_no_worker_and_no_spare(workspace: Path) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", AGENT_HOST, str(workspace)], stdout=subprocess.PIPE, text=True
    ) as host:
        try:
            assert host.stdout is not None and host.stdout.readline() == "ready\n"
            kill_and_judge(host.pid, kernels=2)  # the session's worker and the prewarmed spare
        finally:
            if host.poll() is None:
                host.kill()
