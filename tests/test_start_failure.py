"""A kernel that cannot start says why in .ivralo/python-worker.log, and the host's error names it."""

from __future__ import annotations

from pathlib import Path

from ivralo_kernel.host import Session, WorkerConfig
from ivralo_kernel.protocol import worker_log


async def test_failed_start_is_logged_with_its_stage(workspace: Path) -> None:
    # Six file descriptors (the standard three, the stage pipe, the broker socket, one more) are too
    # few for ipykernel's sockets: a real failure after "guards installed".
    session = Session(workspace=workspace, config=WorkerConfig(rlimit_nofile=6, bootstrap_timeout_ms=30_000))
    async with session:
        result = await session.run("print(1)")
    log = workspace / ".ivralo" / "python-worker.log"
    assert isinstance(result, dict) and result["status"] == "error"
    assert str(log) in result["error"], result["error"]
    entry = worker_log.entries(log)[-1]  # one JSON object per line
    assert entry["last_stage"] == "guards installed"
    assert any("Too many open files" in line for line in entry["stderr_tail"])
    assert entry["message"].startswith("ivralo kernel failed to start: it was killed by signal SIGABRT")  # libzmq


async def test_session_after_a_failed_start_can_start_again(workspace: Path) -> None:
    async with Session(workspace=workspace, config=WorkerConfig(rlimit_nofile=5)) as bad:
        assert isinstance(await bad.run("1"), dict)
    async with Session(workspace=workspace) as good:
        assert await good.run("print('up')") == "up\n"
