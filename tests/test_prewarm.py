"""Warm spare kernels for Jupyter's hosts (issue 17): a notebook's kernel is a spare started before it
was asked for, already sandboxed and guarded, and the pool refills, ends its spares and leaves nothing."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import SANDBOXED_KERNEL
from jupyter_client import KernelManager
from kernel_helpers import execute

from ivralo_kernel.cli.install import install
from ivralo_kernel.host.jupyter import prewarm
from ivralo_kernel.host.sandbox.bwrap import availability
from ivralo_kernel.host.sandbox.memory_cgroup import find_place

SPEC = "ivralo-prewarm"
HOLD_S = 20.0  # how long the pipe's other holder keeps it (a shutdown takes well under 5 s)
pytestmark = pytest.mark.skipif(availability()[0] is None, reason="spares need the bwrap sandbox")


@pytest.fixture(scope="module")
def spec() -> str:
    prefix = Path(os.environ["JUPYTER_PATH"]).parents[1]
    install(prefix=str(prefix), name=SPEC, display_name="Python (ivralo, spares)", provisioner_config={"spares": 1})
    return SPEC


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[prewarm.SparePool]:
    fresh = prewarm.SparePool()
    monkeypatch.setattr(prewarm, "POOL", fresh)
    yield fresh
    fresh.close()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_next_kernel_of_a_workspace_is_the_spare_already_guarded(
    spec: str, pool: prewarm.SparePool, workspace: Path
) -> None:
    first = KernelManager(kernel_name=spec)
    first.start_kernel(cwd=str(workspace))
    second = KernelManager(kernel_name=spec)
    try:
        key = first.provisioner.spare_key
        assert key is not None and key.workspace == str(workspace.resolve())
        assert pool.wait_ready(1, timeout=120, key=key), "no spare became ready"
        (spare_pid,) = pool.ready_pids(key)
        spare_tree = [p.pid for p in psutil.Process(spare_pid).children(recursive=True)]

        second.start_kernel(cwd=str(workspace))
        provisioner = second.provisioner
        assert provisioner.adopted_pid == spare_pid == provisioner.process.pid
        client = second.client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=30)
            section = client.kernel_info(reply=True, timeout=10)["content"]["ivralo"]
            assert section["workspace"] == str(workspace.resolve())
            assert section["layers"]["dumpable"] is False and section["layers"]["memory_cap"] == "RLIMIT_DATA"
            assert execute(client, "x = 6 * 7\nprint(x)").stdout == "42\n"
            # The guards went over: our watchdog reached the spare's broker (its comm id) on the new ports.
            assert provisioner.watchdog is not None and provisioner.watchdog.broker is not None
            assert provisioner.watchdog.broker.ready.wait(15)
            assert provisioner.sandboxed and provisioner.relay is not None
            # The spare's memory cgroup came with its tree (it is removed when this kernel ends).
            if find_place().parent:
                assert provisioner.kernel_cgroup is not None and spare_pid in provisioner.kernel_cgroup.pids()
        finally:
            client.stop_channels()
        # The pool refills in the background, with another kernel.
        assert pool.wait_ready(1, timeout=120, key=key)
        (refill_pid,) = pool.ready_pids(key)
        assert refill_pid != spare_pid
    finally:
        second.shutdown_kernel(now=True)
        first.shutdown_kernel(now=True)
        pool.close()
    assert not [pid for pid in [spare_pid, *spare_tree, refill_pid] if _alive(pid)]
    assert not pool.ready_pids()


def test_another_workspace_starts_cold(spec: str, pool: prewarm.SparePool, tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    first, other = KernelManager(kernel_name=spec), KernelManager(kernel_name=spec)
    first.start_kernel(cwd=str(one))
    try:
        assert pool.wait_ready(1, timeout=120)
        other.start_kernel(cwd=str(two))
        assert other.provisioner.adopted_pid is None
        assert other.provisioner.spare_key != first.provisioner.spare_key
    finally:
        other.shutdown_kernel(now=True)
        first.shutdown_kernel(now=True)
        pool.close()
    assert not pool.ready_pids()


@pytest.mark.timeout(60)
def test_a_shutdown_does_not_wait_for_whoever_holds_the_kernels_output(workspace: Path) -> None:
    """A process out of the kernel's tree that holds its output pipe cannot hang ``shutdown_kernel``.
    A sandbox orphaned by an early interrupt did (jupyter_client interrupts first on every shutdown,
    and a SIGINT to bwrap's group killed bwrap alone): the pool's refills, shut down as they started,
    hung the host on closing a pipe the relay thread was reading. Here the holder is this test."""
    km = KernelManager(kernel_name=SANDBOXED_KERNEL)
    km.start_kernel(cwd=str(workspace))
    process = km.provisioner.process
    holder = os.open(f"/proc/{process.pid}/fd/1", os.O_WRONLY)  # the pipe's write end, kept open
    released: list[bool] = []
    lock = threading.Lock()

    def release() -> None:
        with lock:
            if not released:
                released.append(True)
                os.close(holder)

    # Were the hang back, it would be uninterruptible (a lock taken in C): let go after a while.
    timer = threading.Timer(HOLD_S, release)
    timer.start()
    started = time.monotonic()
    try:
        km.shutdown_kernel(now=True)
        took = time.monotonic() - started
    finally:
        timer.cancel()
        release()
    assert took < HOLD_S, f"shutdown_kernel waited {took:.1f} s for the pipe's other holder"
    assert process.poll() is not None
