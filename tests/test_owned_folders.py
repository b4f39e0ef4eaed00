"""Nothing left behind by a SIGKILLed host: the next start removes its stamped folders, never a live host's."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from leftovers import folders_of, is_held, stale_folders

from ivralo_kernel.host.sandbox.owned_folders import make_owned_folder, release_owned_folder, sweep_stale_folders

HOST = """
import sys
import tempfile
from ivralo_kernel.host.sandbox.owned_folders import make_owned_folder
for prefix in ("ivralo-", "ivralo-xchg-"):
    print(make_owned_folder(prefix, sys.argv[1]), flush=True)
sys.stdin.read()
"""


def _host(parent: Path) -> tuple[subprocess.Popen[str], list[Path]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOST, str(parent)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    folders = [Path(proc.stdout.readline().strip()) for _ in range(2)]  # the handshake: both are made
    return proc, folders


def _end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


@pytest.mark.timeout(60)
def test_a_start_removes_a_killed_hosts_folders_and_keeps_a_live_hosts(tmp_path: Path) -> None:
    roots = ((str(tmp_path), "ivralo-"), (str(tmp_path), "ivralo-xchg-"))
    live, live_folders = _host(tmp_path)
    dead, dead_folders = _host(tmp_path)
    try:
        assert sorted(folders_of(dead.pid, roots)) == sorted(dead_folders)
        os.kill(dead.pid, signal.SIGKILL)
        dead.wait(10)
        assert set(stale_folders(roots)) == set(dead_folders)
        assert all(is_held(f) for f in live_folders)
        # The next host's start sweeps: the killed host's folders go, the live host's stay.
        mine = make_owned_folder("ivralo-", str(tmp_path))
        assert not any(f.exists() for f in dead_folders)
        assert all(f.exists() for f in live_folders)
        assert sweep_stale_folders(str(tmp_path), "ivralo-") == []
        release_owned_folder(mine)
        assert not Path(mine).exists()
        assert stale_folders(roots) == []
    finally:
        _end(live)
        _end(dead)
    assert set(stale_folders(roots)) == set(live_folders)  # the live one is gone now: its folders are stale


@pytest.mark.fast
def test_a_folder_without_a_stamp_is_never_swept(tmp_path: Path) -> None:
    legacy = tmp_path / "ivralo-legacy"  # one being made, or an older release's
    legacy.mkdir()
    assert sweep_stale_folders(str(tmp_path), "ivralo-") == []
    assert legacy.exists()


@pytest.mark.timeout(90)
def test_a_killed_fallback_supervisors_tmp_folder_is_swept(workspace: Path) -> None:
    """Without a sandbox the kernel's private temp folder is on the host's /tmp: the supervisor
    stamps it, so after a SIGKILL (its own removal never runs) the next start removes it."""
    from conftest import FALLBACK_KERNEL, gone, wait_until
    from jupyter_client.manager import KernelManager

    tmp = tempfile.gettempdir()
    roots = ((tmp, "ivralo-kernel-"),)
    manager = KernelManager(kernel_name=FALLBACK_KERNEL)
    manager.start_kernel(cwd=str(workspace))
    try:
        client = manager.client()
        client.start_channels()
        client.wait_for_ready(timeout=60)
        client.stop_channels()
        supervisor = manager.provisioner.supervisor_pid()  # type: ignore[union-attr]
        assert supervisor is not None
        (folder,) = folders_of(supervisor, roots)
        assert is_held(folder)
        os.kill(supervisor, signal.SIGKILL)
        wait_until(lambda: gone(supervisor), 30, "the supervisor's end")
        # Stale now. The host may sweep it at once (it replaces the killed kernel: a new start, which
        # sweeps when its last sweep is old); else the next start's sweep, done here, removes it.
        wait_until(
            lambda: not folder.exists() or not is_held(folder), 10, "the killed supervisor's folder to be let go"
        )
        sweep_stale_folders(tmp, "ivralo-")
        assert not folder.exists()
    finally:
        manager.shutdown_kernel(now=True)


@pytest.mark.timeout(90)
async def test_a_kernel_whose_restarts_failed_leaves_no_folder(workspace: Path) -> None:
    """jupyter_client's restarter gives up after ``restart_limit`` crashes in a row and fires "dead";
    jupyter_server then drops the kernel from its map and never shuts it down. Its folders went only
    when the server exited, and stayed after it (the soak found them)."""
    from jupyter_client.ioloop import AsyncIOLoopKernelManager
    from traitlets.config import Config

    before = set(folders_of(os.getpid()))
    config = Config({"KernelRestarter": {"restart_limit": 0}})  # the first crash is one too many
    manager = AsyncIOLoopKernelManager(kernel_name="ivralo", config=config)
    await manager.start_kernel(cwd=str(workspace))
    client = manager.client()
    try:
        mine = set(folders_of(os.getpid())) - before
        assert mine, "the kernel's own folders (runtime, exchange) were not found"
        dead = asyncio.Event()
        manager.add_restart_callback(dead.set, "dead")  # after the provisioner's own (post_launch)
        client.start_channels()
        await client.wait_for_ready(timeout=60)
        client.execute("import os; os._exit(1)")
        await asyncio.wait_for(dead.wait(), 60)
        left = set(folders_of(os.getpid())) & mine
        assert not left, f"a dead kernel's folders stayed: {sorted(map(str, left))}"
    finally:
        client.stop_channels()
        manager.stop_restarter()
        if await manager.is_alive():
            await manager.shutdown_kernel(now=True)
        else:
            await manager.cleanup_resources()  # what jupyter_server never does for it: the control socket
        if getattr(manager, "_created_context", False):  # its own zmq context: ended here, not by a later GC
            manager.context.destroy(linger=0)
