"""A worker is ready only when its kernel_info_reply carries the ivralo section; a start that does
not get there in time is killed and explained, and a slow start is not a restart loop."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import psutil
import pytest
from conftest import gone, wait_until

from ivralo_kernel.host import Session, WorkerConfig
from ivralo_kernel.protocol import worker_log


def slow_startup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """An IPython startup file that takes ``seconds``: a real way for a kernel to boot slowly."""
    startup = tmp_path / "ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-slow.py").write_text(
        f"import sys, time\nprint('loading the team startup file', file=sys.stderr)\ntime.sleep({seconds})\n"
    )
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))


async def test_bootstrap_timeout_kills_and_explains(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow_startup(tmp_path, monkeypatch, 30)
    # 4 s: long enough that the start reaches the startup file's sleep, and shows half a second
    # without CPU before the budget ends, even on a loaded 2-core machine (else "starved" is true).
    config = WorkerConfig(bootstrap_timeout_ms=4_000, observer_poll_ms=100)
    async with Session(workspace=workspace, config=config) as session:
        start = time.monotonic()
        result = await session.run("print(1)")
        assert time.monotonic() - start < 4 + 3, "the budget is kept (plus the kill)"
    assert isinstance(result, dict)
    error = result["error"]
    assert error.startswith("ivralo worker pid=") and "did not become ready within 4000 ms" in error
    assert "no ivralo kernel_info_reply within the bootstrap budget" in error
    assert "(stalled)" in error, f"sleeping in a startup file is a stall, not starvation: {error}"
    assert "last stage: guards installed" in error
    # The kernel's own stderr is quoted (over TCP ipykernel warns there; over ipc it has nothing to
    # say); what the startup file printed is user output, which goes to IOPub, not here.
    assert "; stderr tail: " in error and "loading the team startup file" not in error, error
    entry = worker_log.entries(workspace / ".ivralo" / "python-worker.log")[-1]
    assert entry["message"] == "ivralo kernel failed to start: it was stopped by the host before it was ready."
    assert str(workspace / ".ivralo" / "python-worker.log") in error
    assert "raise WorkerConfig.bootstrap_timeout_ms" in error
    pid = int(error.removeprefix("ivralo worker pid=").split()[0])
    wait_until(lambda: gone(pid), 2, "the half-started kernel to be killed")


@pytest.mark.slow
async def test_a_bootstrap_slower_than_five_seconds_is_not_a_restart_loop(
    tmp_path: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow_startup(tmp_path, monkeypatch, 6)
    spawned: list[int] = []
    async with Session(workspace=workspace, config=WorkerConfig(bootstrap_timeout_ms=30_000)) as session:
        assert await session.run("print('up')") == "up\n"
        spawned.append(session.pid or 0)
        assert await session.run("print('same worker')") == "same worker\n"
        assert session.pid == spawned[0], "one worker, started once"
        bootstrap_ms = session.kernel_info["ivralo"]["bootstrap_ms"]
        assert bootstrap_ms > 6000
        supervisor = psutil.Process(session.supervisor_pid)
        assert [p.pid for p in supervisor.children()] == spawned


async def test_a_host_with_more_than_1024_descriptors_starts_kernels(workspace: Path) -> None:
    """The host passes its pipe to the supervisor under its own number: a host with many kernels
    open (their sockets, relays) has it above 1023, where select() cannot watch it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1300:
        pytest.skip(f"RLIMIT_NOFILE's hard limit is {hard}: cannot open 1024 descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1300), hard))
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        probe = os.open(os.devnull, os.O_RDONLY)
        os.close(probe)
        assert probe > 1023, "the host's next descriptors are above select()'s range"
        async with Session(workspace=workspace) as session:
            assert await session.run("print('up')") == "up\n"
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
