"""The agent API in its first form: lazy start, persistent variables, the str-or-dict contract,
one call at a time."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psutil
from conftest import gone, wait_until

from ivralo_kernel.host import Session, SyncSession


async def test_lazy_start_and_persistent_variables(workspace: Path) -> None:
    async with Session(workspace=workspace) as session:
        assert session.pid is None, "nothing starts before the first call"
        assert await session.run("x = 1\nprint(x)") == "1\n"
        assert await session.run("x += 1\nx") == "2\n", "the result's text is returned too"
        pid = session.pid
        assert pid is not None and psutil.pid_exists(pid)
        assert await session.list_vars() == ["x"]
    wait_until(lambda: gone(pid), 5, "the worker to stop when the session closes")


async def test_error_dict_keeps_the_output_before_the_error(workspace: Path) -> None:
    async with Session(workspace=workspace) as session:
        result = await session.run("print('before')\nraise ValueError('bad input: 42')")
        assert isinstance(result, dict)
        assert result["status"] == "error" and result["result"] == "before\n"
        assert "ValueError: bad input: 42" in result["error"] and "\x1b[" not in result["error"]
        assert await session.run("print('next call works')") == "next call works\n"


async def test_calls_never_overlap(workspace: Path) -> None:
    code = "import time\nt0 = time.monotonic(); time.sleep(0.3); print(t0, time.monotonic())"
    async with Session(workspace=workspace) as session:
        first, second = await asyncio.gather(session.run(code), session.run(code))
    spans = sorted(tuple(map(float, str(r).split())) for r in (first, second))
    assert spans[0][1] <= spans[1][0], f"two calls ran at the same time: {spans}"


async def test_crash_reports_lost_names_and_recovers(workspace: Path) -> None:
    async with Session(workspace=workspace) as session:
        await session.run("alpha = 1\nbeta = [2]")
        result = await session.run("import os; os._exit(9)")
        assert isinstance(result, dict) and result["status"] == "error"
        error = result["error"]
        assert error.startswith("REPL worker terminated (crash: the kernel exited with status 9; observer: ")
        assert error.endswith(
            "ALL variables in this session were lost: alpha, beta. The names the stopped call assigns may "
            "also be lost: os. You must recreate any state you need before retrying."
        )
        assert result["result"] == "", "said once: in error"
        assert await session.run("print('alpha' in dir())") == "False\n", "a fresh worker, empty namespace"


def test_sync_session_for_scripts(workspace: Path) -> None:
    with SyncSession(workspace=workspace) as session:
        assert session.run("y = 'sync'") == ""
        assert session.run("print(y)") == "sync\n"


async def test_namespace_api(workspace: Path) -> None:
    import pandas as pd

    async with Session(workspace=workspace) as session:
        await session.set_var("config", {"rows": 3, "names": ["a", "b"]})
        assert await session.get_var("config") == {"rows": 3, "names": ["a", "b"]}
        assert await session.run("print(config['rows'] * 2)") == "6\n"
        await session.inject_dataframe("df", pd.DataFrame({"a": [1, 2, 3]}))
        assert await session.run("print(int(df.a.sum()))") == "6\n"
        snapshot = await session.snapshot()
        assert snapshot["config"] == {"type": "dict", "len": 2, "bytes": snapshot["config"]["bytes"]}
        assert snapshot["df"]["type"] == "DataFrame" and snapshot["df"]["shape"] == [3, 1]
        assert snapshot["df"]["bytes"] >= 3 * 8  # shallow: the column's values and the index
        assert set(snapshot) == {"config", "df"}
        assert await session.list_vars() == ["config", "df"]
        try:
            await session.get_var("not a name")
        except ValueError as exc:
            assert "not a Python variable name" in str(exc)
        else:
            raise AssertionError("a bad name must be refused")
        await session.reset()
        assert await session.list_vars() == []
        assert await session.run("print('config' in dir())") == "False\n"
