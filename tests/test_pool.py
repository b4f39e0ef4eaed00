"""WorkerPool: prewarmed spares, the max_workers ceiling, the idle sweep, the host memory reserve,
restart-loop warnings, and a teardown that never waits on busy workers."""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path

import pytest
from conftest import gone, wait_until, wait_until_async

import ivralo_kernel.host.agent.pool as pool_module
from ivralo_kernel.host import Session, WorkerConfig, WorkerPool


async def test_prewarmed_spare_serves_the_first_call_and_is_replaced(workspace: Path) -> None:
    async with WorkerPool(workspace, config=WorkerConfig(prewarm_pool_size=1)) as pool:
        await pool.wait_prewarmed()
        spare = pool.spares[0]
        ready = spare.km.provisioner.host_pid(spare.kernel_info["ivralo"]["pid"]) == spare.pid
        assert ready, "a spare is ready (its kernel answered kernel_info), not merely spawned"
        async with Session(pool=pool) as session:
            assert await session.run("print(1 + 1)") == "2\n"
            assert session.pid == spare.pid, "the warm path does not pay a kernel start: the spare answered"
            await pool.wait_prewarmed()
            assert len(pool.spares) == 1 and pool.spares[0] is not spare, "the pool replaces what it handed out"


async def test_max_workers_refuses_at_once_naming_the_setting(workspace: Path) -> None:
    async with WorkerPool(workspace, config=WorkerConfig(max_workers=1)) as pool:
        async with Session(pool=pool) as first, Session(pool=pool) as second:
            assert await first.run("a = 1") == ""
            # No queueing: a queued call would wait for `first`, which stays open, so wait_for would end it.
            result = await asyncio.wait_for(second.run("print('never')"), 30)
            assert result == {
                "status": "error",
                "result": "",
                "error": "all 1 workers are in use (max_workers=1); close an idle session or raise "
                "WorkerConfig.max_workers",
            }
            await first.close()
            assert await second.run("print('now there is room')") == "now there is room\n"


async def test_idle_workers_are_swept_and_the_next_call_gets_a_fresh_one(workspace: Path) -> None:
    async with WorkerPool(workspace, config=WorkerConfig(idle_ttl_seconds=1)) as pool:
        async with Session(pool=pool) as session:
            await session.run("x = 1")
            pid = session.pid
            assert pid is not None
            await wait_until_async(lambda: gone(pid), 5, "the idle worker to be ended by the sweep")
            assert await session.run("print('x' in dir())") == "False\n", "fresh namespace, and not an error"


async def test_host_memory_reserve_evicts_spares_then_refuses(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = WorkerConfig(prewarm_pool_size=1, host_memory_reserve_bytes=1 << 30)
    async with WorkerPool(workspace, config=config) as pool:
        await pool.wait_prewarmed()
        spare_pid = pool.spares[0].pid
        # The host's available memory is what this policy reacts to: report a short host.
        monkeypatch.setattr(pool_module, "available_memory", lambda: 256 << 20)
        with pytest.raises(pool_module.HostMemoryError, match="below host_memory_reserve_bytes=1073741824"):
            await pool._start_worker()
        assert pool.spares == []
        assert spare_pid is not None
        wait_until(lambda: gone(spare_pid), 5, "the evicted spare to be gone")
        async with Session(pool=pool) as session:
            result = await session.run("1")
            assert isinstance(result, dict) and "Close sessions you no longer need" in result["error"]


async def test_third_restart_in_a_minute_is_called_out(workspace: Path) -> None:
    async with Session(workspace=workspace) as session:
        for attempt in range(3):
            result = await session.run("import os; os._exit(7)")
            assert isinstance(result, dict)
            if attempt < 2:
                assert "[ivralo] this session's worker was lost" not in result["result"]
        assert "[ivralo] this session's worker was lost 3 times in the last 60 s" in result["result"]
        assert "crash: the kernel exited with status 7" in result["result"]


async def test_closing_the_pool_does_not_wait_for_busy_workers(workspace: Path) -> None:
    pool = WorkerPool(workspace, config=WorkerConfig(deadline_ms=600_000, interrupt_grace_ms=1000))
    session = Session(pool=pool)
    busy = asyncio.create_task(session.run("import pathlib, time\npathlib.Path('started').touch()\ntime.sleep(600)"))
    await wait_until_async(lambda: (workspace / "started").exists(), 60, "the cell to start running")
    pid = session.pid
    assert pid is not None
    start = time.monotonic()
    await pool.close()
    assert time.monotonic() - start < 5
    wait_until(lambda: gone(pid), 3, "the busy worker to be gone")
    result = await asyncio.wait_for(busy, 5)
    assert isinstance(result, dict) and "ALL variables" in result["error"]
    await session.close()


def maps_arrow(pid: int) -> bool:
    """Whether the process has pyarrow's library mapped: read from outside, in /proc."""
    return "libarrow" in Path(f"/proc/{pid}/maps").read_text()


async def test_spares_warm_the_data_plane_once_a_session_moved_a_table(workspace: Path) -> None:
    """A pool's spares import pyarrow and pandas while they wait, and only once a session of the pool
    has moved a table (the imports cost memory): judged from /proc, the kernel's mapped libraries."""
    import pandas as pd

    async with WorkerPool(workspace, config=WorkerConfig(prewarm_pool_size=1)) as pool:
        await pool.wait_prewarmed()
        plain = pool.spares[0]
        assert plain.pid is not None and not maps_arrow(plain.pid), "no table yet: the spare imported nothing"
        async with Session(pool=pool) as session:
            await session.inject_dataframe("df", pd.DataFrame({"x": [1.0, 2.0]}))
        await wait_until_async(lambda: bool(pool.spares) and pool.spares[0] is not plain, 60, "the next spare")
        warm = pool.spares[0]
        assert warm.pid is not None and maps_arrow(warm.pid), "the spare imported pyarrow while it waited"
        async with Session(pool=pool) as session:
            assert await session.run("import sys\nprint('pandas' in sys.modules)") == "True\n"
            await session.inject_dataframe("df", pd.DataFrame({"x": [3.0]}))
            assert await session.run("print(df.x.sum())") == "3.0\n"


# The launch's pipes, cancelled before the output relay took them, are closed by the collector.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_pool_closed_while_its_spare_starts_leaves_nothing_running(workspace: Path) -> None:
    """Cancelled mid-start (the pool closes), the spare's tree ends too: judged by this process's children."""
    import psutil

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    pool = WorkerPool(workspace, config=WorkerConfig(prewarm_pool_size=1))
    await pool.start()
    await wait_until_async(
        lambda: bool({p.pid for p in psutil.Process().children(recursive=True)} - before), 30, "the spare's launch"
    )
    await pool.close()
    await asyncio.sleep(0)  # the cancelled start's clean-up runs on the loop

    def started_gone() -> bool:
        return all(gone(p.pid) for p in psutil.Process().children(recursive=True) if p.pid not in before)

    await wait_until_async(started_gone, 15, "the spare's tree to end")
    gc.collect()  # those pipes' warnings now, under this test's filter, not in a later test's
