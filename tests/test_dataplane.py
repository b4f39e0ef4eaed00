"""The namespace API's data plane: tables over Arrow IPC in shared memory, values that come back
safely, and namespace calls that survive a timeout (issue 14).

Every test drives a real worker through ``Session``. "No segment left" is judged from outside: the
worker's exchange folder (the one folder the sandbox shares for this) and the host's ``/dev/shm``.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from conftest import wait_until_async

from ivralo_kernel.host import (
    ArrowMissingError,
    NamespaceTimeoutError,
    NamespaceWorkerLostError,
    Session,
    TransferRefusedError,
    UnsupportedValueError,
    WorkerConfig,
)
from ivralo_kernel.host.sandbox.exchange_folder import SEGMENT_PREFIX, SHM
from ivralo_kernel.host.sandbox.plan import SandboxPlan

ROWS_100MB = 6_553_600  # two 8-byte columns: 104,857,600 bytes
SLOW_REPR = "import time\nclass {name}:\n    def __repr__(self):\n        time.sleep({seconds})\n        return 's'\n"


def exchange_dir(session: Session) -> str:
    assert session._worker is not None
    folder = session._worker.km.provisioner.exchange_dir
    assert folder and os.path.isdir(folder)
    return str(folder)


def segments_left(folder: str | None) -> list[str]:
    """Segment files in the worker's exchange folder and anywhere in the host's /dev/shm."""
    found = []
    for root in filter(None, {folder, SHM}):
        if not os.path.isdir(root):
            continue
        for dirpath, _dirs, files in os.walk(root):
            if dirpath == SHM or os.path.basename(dirpath).startswith("ivralo-xchg-"):
                found += [os.path.join(dirpath, f) for f in files if f.startswith(SEGMENT_PREFIX)]
    return found


def big_frame() -> pd.DataFrame:
    rng = np.random.default_rng(14)
    return pd.DataFrame({"id": np.arange(ROWS_100MB, dtype=np.int64), "value": rng.random(ROWS_100MB)})


async def test_a_100_mb_dataframe_goes_in_and_comes_back_equal(workspace: Path) -> None:
    frame = big_frame()
    assert frame.memory_usage(index=False).sum() >= 100 * 2**20
    async with Session(workspace=workspace) as session:
        await session.inject_dataframe("df", frame)
        folder = exchange_dir(session)
        assert segments_left(folder) == []  # unlinked as soon as the kernel mapped it
        assert await session.run("print(len(df), float(df.value.sum()) > 0)") == f"{ROWS_100MB} True\n"
        back = await session.get_dataframe("df")
        pd.testing.assert_frame_equal(back, frame)
        assert segments_left(folder) == []
        # A pyarrow table stays one, and so do strings and nulls (which Arrow carries as they are).
        table = pa.table({"name": ["a", None, "c"], "n": pa.array([1, None, 3], pa.int32())})
        await session.inject_dataframe("t", table)
        assert (await session.get_dataframe("t")).equals(table)
        assert (
            await session.run(
                "import pandas as pd; s = df.value.head(3); words = pd.DataFrame({'w': ['x', 'y', None]})"
            )
            == ""
        )
        pd.testing.assert_series_equal(await session.get_var("s"), frame.value.head(3))
        pd.testing.assert_frame_equal(await session.get_dataframe("words"), await session.get_var("words"))
        snap = await session.snapshot()
        assert snap["df"] == {"type": "DataFrame", "shape": [ROWS_100MB, 2], "bytes": int(frame.memory_usage().sum())}
        assert snap["t"]["type"] == "Table" and snap["t"]["shape"] == [3, 2]
        assert segments_left(folder) == []
    assert not os.path.exists(folder)


async def test_values_come_back_as_json_npy_or_arrow_and_nothing_else_runs_on_the_host(
    workspace: Path, tmp_path: Path
) -> None:
    marker = tmp_path / "host-marker"  # outside the workspace: only the host could create it
    hostile = f"""
import os
class Hostile:
    def __reduce__(self):
        return (os.system, ("touch {marker}",))
    def __repr__(self):
        return "Hostile()" + "x" * 5000
evil = Hostile()
evil_array = np.array([Hostile()], dtype=object)
"""
    async with Session(workspace=workspace) as session:
        await session.run("import numpy as np\narr = np.arange(12, dtype=np.float32).reshape(3, 4).T\nn = np.int64(7)")
        await session.run(hostile)
        folder = exchange_dir(session)
        array = await session.get_var("arr")
        np.testing.assert_array_equal(array, np.arange(12, dtype=np.float32).reshape(3, 4).T)
        assert await session.get_var("n") == 7
        with pytest.raises(UnsupportedValueError, match=r"get_var\('evil'\): evil is a __main__\.Hostile") as refused:
            await session.get_var("evil")
        assert "or_repr=True" in str(refused.value)
        with pytest.raises(UnsupportedValueError, match="dtype object"):
            await session.get_var("evil_array")
        with pytest.raises(UnsupportedValueError, match="not a table"):
            await session.get_dataframe("arr")
        text = await session.get_var("evil", or_repr=True)
        assert text.startswith("Hostile()xxx") and len(text) == 1000
        assert segments_left(folder) == []
    assert not marker.exists()  # __reduce__ ran nowhere: nothing was ever unpickled


async def test_a_column_arrow_cannot_carry_is_named_with_its_dtype(workspace: Path) -> None:
    class Opaque:
        pass

    frame = pd.DataFrame({"ok": [1, 2], "blob": [Opaque(), Opaque()]})
    async with Session(workspace=workspace) as session:
        with pytest.raises(UnsupportedValueError, match=r"column 'blob' \(dtype object\).*never falls back to pickle"):
            await session.inject_dataframe("df", frame)
        assert session._worker is None  # refused on the host, before any worker was needed
        await session.run("import pandas as pd\nclass Opaque: pass\n")
        await session.run("bad = pd.DataFrame({'ok': [1], 'blob': [Opaque()]})")
        with pytest.raises(UnsupportedValueError, match=r"column 'blob' \(dtype object\)"):
            await session.get_dataframe("bad")
        assert segments_left(exchange_dir(session)) == []
        assert await session.list_vars() == ["Opaque", "bad", "pd"]


async def test_a_timeout_is_not_lethal_and_the_late_reply_answers_nobody(workspace: Path) -> None:
    config = WorkerConfig(namespace_timeout_ms=2000)
    async with Session(workspace=workspace, config=config) as session:
        await session.run(SLOW_REPR.format(name="Slow", seconds=3))
        await session.run("slow = Slow(); x = 41")
        pid = session.pid
        with pytest.raises(NamespaceTimeoutError) as timed_out:
            await session.get_var("slow", or_repr=True)
        message = str(timed_out.value)
        assert f"pid={pid}" in message and "get_var('slow')" in message and "namespace_timeout_ms=2000" in message
        # The kernel is still in the first request; the next call waits its turn and gets its own answer,
        # not the late 'slow'.
        assert await session.get_var("x") == 41
        assert session.pid == pid
        assert await session.run("print(x + 1)") == "42\n"


async def test_a_worker_killed_mid_transfer_leaves_no_segment(workspace: Path) -> None:
    config = WorkerConfig(namespace_timeout_ms=4000)
    frame = big_frame()
    async with Session(workspace=workspace, config=config) as session:
        await session.run(SLOW_REPR.format(name="Stuck", seconds=60))
        await session.run("stuck = Stuck()")
        folder = exchange_dir(session)
        with pytest.raises(NamespaceTimeoutError):
            await session.get_var("stuck", or_repr=True)  # the kernel is now busy for a minute
        transfer = asyncio.create_task(session.inject_dataframe("df", frame))
        # The host made the segment and wrote the table; the kernel cannot map it before it is killed.
        await wait_until_async(lambda: bool(segments_left(folder)), 3.0, "the segment to be created")
        await session.interrupt()
        with pytest.raises(NamespaceWorkerLostError, match="interrupted"):
            await transfer
        assert segments_left(folder) == []
        assert not os.path.exists(folder)  # the worker's exchange folder went with it
        assert await session.run("print('fresh')") == "fresh\n"


def test_without_pyarrow_the_calls_name_the_extra(monkeypatch: pytest.MonkeyPatch, workspace: Path) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` now raises ImportError

    async def calls() -> None:
        async with Session(workspace=workspace) as session:
            with pytest.raises(ArrowMissingError, match=r"pip install 'ivralo-kernel\[arrow\]'"):
                await session.inject_dataframe("df", pd.DataFrame({"a": [1]}))
            with pytest.raises(ArrowMissingError, match=r"get_dataframe\('df'\) needs pyarrow"):
                await session.get_dataframe("df")
            assert session._worker is None

    asyncio.run(calls())


@pytest.mark.fast
def test_the_sandbox_binds_the_exchange_folder_over_its_empty_dev_shm(tmp_path: Path) -> None:
    exchange = tmp_path / "ivralo-xchg-test"
    exchange.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    plan = SandboxPlan(
        bwrap="bwrap", workspace=str(tmp_path), run_dir=str(run), empty_file="/dev/null", exchange_dir=str(exchange)
    )
    argv = plan.argv(["python"])
    bind = argv.index(str(exchange)) - 1
    assert argv[bind : bind + 3] == ["--bind", str(exchange), str(exchange)]
    if os.path.isdir(SHM):
        assert argv.index("--tmpfs") < bind and "/dev/shm" in argv[:bind]


async def test_without_the_sandbox_the_segment_lives_in_dev_shm(workspace: Path) -> None:
    frame = pd.DataFrame({"a": np.arange(1000), "b": ["x"] * 1000})
    async with Session(workspace=workspace, config=WorkerConfig(sandbox="off")) as session:
        await session.inject_dataframe("df", frame)
        assert session._worker is not None and not session._worker.km.provisioner.sandboxed
        folder = exchange_dir(session)
        if os.path.isdir(SHM):
            assert os.path.dirname(folder) == SHM
        pd.testing.assert_frame_equal(await session.get_dataframe("df"), frame)
        assert segments_left(folder) == []


# --- the kernel lies (code in the kernel replaces its data plane) -------------------------------------

FORGED_SIZE = """
import json
real = _ivralo_dataplane
class Forged:
    def __getattr__(self, name):
        return getattr(real, name)
    def prepare(self, name, tables_only=False, or_repr=False):
        return json.dumps({{"kind": "arrow", "size": {size}, "as": "pandas.DataFrame"}})
_ivralo_dataplane = Forged()
"""

# A string column whose offsets run backwards (5, then -2000000000): Arrow's cheap validate() passes it.
FORGED_ARROW = """
import json
import numpy as np
import pyarrow as pa
real = _ivralo_dataplane
offsets = pa.py_buffer(np.array([0, 5, -2_000_000_000, 6], dtype=np.int32).tobytes())
column = pa.Array.from_buffers(pa.string(), 3, [None, offsets, pa.py_buffer(b"abcdef")])
sink = pa.BufferOutputStream()
with pa.ipc.new_stream(sink, pa.schema([("s", pa.string())])) as writer:
    writer.write_table(pa.table({"s": column}))
forged = sink.getvalue().to_pybytes()
class Forged:
    def __getattr__(self, name):
        return getattr(real, name)
    def prepare(self, name, tables_only=False, or_repr=False):
        return json.dumps({"kind": "arrow", "size": len(forged), "as": "pandas.DataFrame"})
    def write(self, path, capacity):
        real._map(path, capacity)[: len(forged)] = forged
        return json.dumps({"size": len(forged)})
_ivralo_dataplane = Forged()
"""


def reset_peak_rss() -> None:
    """The host's (this process's) peak RSS starts again from its current RSS (Linux >= 4.0)."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss_bytes() -> int:
    match = re.search(r"^VmHWM:\s+(\d+) kB$", Path("/proc/self/status").read_text(), re.MULTILINE)
    assert match, "no VmHWM in /proc/self/status"
    return int(match.group(1)) * 1024


@pytest.mark.parametrize(
    ("limit", "size"),
    [(None, 1 << 50), (1 << 30, int(4.2 * (1 << 30)))],
    ids=["a-pebibyte-under-the-default-limit", "4.2-GiB-under-a-1-GiB-limit"],
)
async def test_a_size_the_kernel_declares_is_checked_before_anything_is_reserved(
    workspace: Path, limit: int | None, size: int
) -> None:
    """Judged from the host: a clear error, the host's peak RSS and /dev/shm unchanged by the declared
    size, no segment left, the worker still answering."""
    config = WorkerConfig() if limit is None else WorkerConfig(memory_limit_bytes=limit)
    async with Session(workspace=workspace, config=config) as session:
        assert await session.run("import pandas as pd\ndf = pd.DataFrame({'x': [1, 2]})") == ""
        assert await session.run(FORGED_SIZE.format(size=size)) == ""
        folder = exchange_dir(session)
        reset_peak_rss()
        before = peak_rss_bytes()
        with pytest.raises(TransferRefusedError, match="more than the host takes in one transfer") as refused:
            await session.get_dataframe("df")
        grown = peak_rss_bytes() - before
        assert f"({size} bytes)" in str(refused.value) and "Nothing was reserved" in str(refused.value)
        assert "transfer_cap_bytes" in str(refused.value)
        assert grown < 64 << 20, f"the host's peak RSS grew by {grown >> 20} MiB"
        assert segments_left(folder) == []
        assert await session.run("print(len(df))") == "2\n"


async def test_arrow_data_the_kernel_forged_is_validated_in_full_before_it_is_converted(workspace: Path) -> None:
    """Offsets out of order pass Arrow's cheap validate(); converting them read the host's memory
    out of bounds (a SIGSEGV once). The host lives: it runs this test and asks the worker again."""
    async with Session(workspace=workspace) as session:
        assert await session.run("import pandas as pd\ndf = pd.DataFrame({'x': [1, 2]})") == ""
        assert await session.run(FORGED_ARROW) == ""
        folder = exchange_dir(session)
        with pytest.raises(TransferRefusedError, match="the Arrow data the kernel wrote is not valid") as refused:
            await session.get_dataframe("df")
        assert "non-monotonic offset" in str(refused.value), refused.value
        assert segments_left(folder) == []
        assert await session.run("print(len(df))") == "2\n"


# The kernel truncates the segment the host reserved (through a descriptor of its own, before anything
# maps it) and says it wrote a megabyte: a host that mapped the segment would die of SIGBUS touching it.
TRUNCATED = """
import json, os
real = _ivralo_dataplane
class Forged:
    def __getattr__(self, name):
        return getattr(real, name)
    def write(self, path, capacity):
        fd = os.open(path, os.O_RDWR)
        os.ftruncate(fd, 0)
        os.close(fd)
        return json.dumps({"size": 1 << 20})
_ivralo_dataplane = Forged()
"""


async def test_a_segment_the_kernel_truncates_does_not_kill_the_host(workspace: Path) -> None:
    """Landlock's truncate right (ABI 3, Linux 6.2) refuses the truncate where it exists; without it
    (older kernels, or landlock=False as here) the host's own reads must hold: it never maps."""
    async with Session(workspace=workspace, config=WorkerConfig(landlock=False)) as session:
        # 1.6 MB, made in the kernel: the get's segment is a fresh one, its file still there to open.
        assert await session.run("import numpy as np, pandas as pd\ndf = pd.DataFrame({'x': np.arange(200_000)})") == ""
        assert await session.run(TRUNCATED) == ""
        with pytest.raises(TransferRefusedError, match="truncated from the kernel's side"):
            await session.get_dataframe("df")
        assert segments_left(exchange_dir(session)) == []
        assert await session.run("print(len(df))") == "200000\n"


async def test_the_transfer_cap_is_a_setting(workspace: Path) -> None:
    """A real table larger than transfer_cap_bytes is refused before anything is reserved, naming
    the setting; under it, the same call works."""
    async with Session(workspace=workspace, config=WorkerConfig(transfer_cap_bytes=1 << 20)) as session:
        made = "import numpy as np, pandas as pd\nbig = pd.DataFrame({'x': np.arange(200_000)})\nsmall = big.head(10)"
        assert await session.run(made) == ""
        with pytest.raises(TransferRefusedError, match=r"1\.0 MiB, transfer_cap_bytes\. Nothing was reserved"):
            await session.get_dataframe("big")
        assert len(await session.get_dataframe("small")) == 10


# --- the hot path (issue 29) ----------------------------------------------------------------------

PLAIN_FRAMES = {
    "ints-and-floats": pd.DataFrame(
        {
            "i": np.arange(5, dtype=np.int64),
            "f": np.linspace(0, 1, 5),
            "f32": np.arange(5, dtype=np.float32),
            "u8": np.arange(5, dtype=np.uint8),
            "f16": np.arange(5, dtype=np.float16),
        }
    ),
    "a-nan-becomes-null-and-back": pd.DataFrame({"f": [1.0, np.nan, 3.0], "g": [np.inf, -np.inf, 0.0]}),
    "a-named-stepped-range-index": pd.DataFrame({"i": [1, 2]}, index=pd.RangeIndex(10, 14, 2, name="r")),
    "booleans": pd.DataFrame({"b": [True, False]}),
    "strings": pd.DataFrame({"s": ["x", None]}),
    "empty": pd.DataFrame({"f": np.array([], dtype=float)}),
    "no-columns": pd.DataFrame(),
    "a-label-index": pd.DataFrame({"i": [1]}, index=["x"]),
    "a-named-columns-index": pd.DataFrame({"i": [1]}).rename_axis(columns="cols"),
    "nullable-ints": pd.DataFrame({"i": pd.array([1, None], dtype="Int64")}),
    "from-a-2d-array": pd.DataFrame(np.arange(6.0).reshape(3, 2), columns=["p", "q"]),
    "a-slice": pd.DataFrame({"f": np.arange(10.0)}).iloc[::2],
}


@pytest.mark.fast
@pytest.mark.parametrize("name", sorted(PLAIN_FRAMES))
def test_the_fast_conversions_give_what_pyarrow_gives(name: str) -> None:
    """``table_from_pandas`` (no NaN scan where there is no NaN) is ``Table.from_pandas``, schema and
    pandas metadata included; the host's decoding of a plain numeric frame (numpy views of its own
    copy) is ``to_pandas()``, and its columns are writable, as that frame's are."""
    from ivralo_kernel.host.agent.dataplane import decode_segment
    from ivralo_kernel.protocol.tables import table_from_pandas

    frame = PLAIN_FRAMES[name]
    table = table_from_pandas(pa, frame)
    expected = pa.Table.from_pandas(frame, preserve_index=None)
    assert table.equals(expected, check_metadata=True)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    own = np.frombuffer(sink.getvalue(), dtype=np.uint8).copy()  # the host's own copy of the segment
    back = decode_segment({"kind": "arrow", "as": "pandas.DataFrame"}, own, len(own))
    reference = expected.to_pandas()
    pd.testing.assert_frame_equal(back, reference, check_exact=True, check_column_type=True, check_index_type=True)
    assert back.columns.names == reference.columns.names and back.index.name == reference.index.name
    if len(back) and len(back.columns) and back.dtypes.iloc[0].kind in "iuf":
        back.iloc[0, 0] = 7
        assert back.iloc[0, 0] == 7


async def test_a_held_segment_serves_the_next_gets_in_one_request(workspace: Path) -> None:
    """After a first transfer both sides hold the segment, and the kernel writes while it prepares
    (``prepare_into``): the values come back equal and writable, each its own copy; a larger one
    gets a new segment; an array and a value that is not a table take the same path."""
    async with Session(workspace=workspace) as session:
        made = (
            "import numpy as np, pandas as pd\n"
            "df = pd.DataFrame({'i': np.arange(100_000), 'f': np.linspace(0, 1, 100_000)})\n"
            "df.loc[3, 'f'] = float('nan')\n"
            "big = pd.concat([df] * 4, ignore_index=True)\narr = np.arange(50_000.0).reshape(500, 100)"
        )
        assert await session.run(made) == ""
        first = await session.get_dataframe("df")
        held = session._worker.held_segment() if session._worker else None
        assert held is not None, "the first get left a segment both sides hold"
        second = await session.get_dataframe("df")
        pd.testing.assert_frame_equal(second, first)
        assert np.isnan(second.f[3]) and second.f.isna().sum() == 1
        second.loc[0, "i"] = -1
        assert first.i[0] == 0, "each get is a copy of its own"
        larger = await session.get_dataframe("big")
        assert len(larger) == 400_000 and larger.i.iloc[-1] == 99_999
        assert session._worker is not None and session._worker.held_segment() != held, "a new, larger segment"
        np.testing.assert_array_equal(await session.get_var("arr"), np.arange(50_000.0).reshape(500, 100))
        pd.testing.assert_frame_equal(await session.get_dataframe("df"), first)
        assert segments_left(exchange_dir(session)) == []


# The kernel's prepare_into says it wrote more than the segment the host holds.
OVERWRITTEN = """
import json
real = _ivralo_dataplane
class Forged:
    def __getattr__(self, name):
        return getattr(real, name)
    def prepare_into(self, name, tables_only, or_repr, path, capacity):
        envelope = json.loads(real.prepare_into(name, tables_only, or_repr, path, capacity))
        envelope["written"] = capacity + 1
        return json.dumps(envelope)
_ivralo_dataplane = Forged()
"""


async def test_a_length_past_the_held_segment_is_refused(workspace: Path) -> None:
    async with Session(workspace=workspace) as session:
        assert await session.run("import pandas as pd\ndf = pd.DataFrame({'x': [1, 2]})") == ""
        assert len(await session.get_dataframe("df")) == 2
        assert await session.run(OVERWRITTEN) == ""
        with pytest.raises(TransferRefusedError, match="the segment the host reserved"):
            await session.get_dataframe("df")
        assert segments_left(exchange_dir(session)) == []
        assert await session.run("print(len(df))") == "2\n"


@pytest.mark.fast
def test_the_hosts_read_memory_is_reused_only_once_no_value_views_it() -> None:
    """``ReadBuffers``: the memory of the last read serves the next one that fits, never while a value
    decoded from it (a view of it) is alive; a read less than half its size gets fresh memory."""
    from ivralo_kernel.host.agent.read_buffers import MIN_BYTES, ReadBuffers

    def address(array: np.ndarray) -> int:
        return int(array.__array_interface__["data"][0])

    size = 4 * MIN_BYTES
    buffers = ReadBuffers()
    try:
        first = buffers.take(size)
        column = first[64:1024].view(np.int64)  # what a decoded DataFrame keeps of it
        del first
        second = buffers.take(size)
        assert not np.shares_memory(second, column), "handed out while a value still views it"
        second_at = address(second)
        del second, column
        third = buffers.take(size)
        assert address(third) == second_at, "once nothing views it, the next read reuses it"
        del third
        assert address(buffers.take(size * 3 // 4)) == second_at  # it fits, and is not twice as large
        # A quarter of it: fresh memory (made while the kept one still exists, so never at its address).
        assert address(buffers.take(MIN_BYTES)) != second_at
    finally:
        buffers.release()


async def test_a_table_the_host_returned_is_never_overwritten_by_the_next_get(workspace: Path) -> None:
    """The host keeps its last read's memory for the next one (fresh memory for 100 MB cost 50-170 ms
    of page faults here, against 10 ms to copy into): a DataFrame still using it is never written
    over, and once it is dropped the next get of the same size lands in the same memory."""
    async with Session(workspace=workspace) as session:
        made = "import numpy as np, pandas as pd\n"
        made += "df = pd.DataFrame({'i': np.arange(1_000_000), 'f': np.zeros(1_000_000)})"
        assert await session.run(made) == ""
        first = await session.get_dataframe("df")
        assert await session.run("df['i'] = -df['i']\ndf['f'] = 1.0") == ""
        second = await session.get_dataframe("df")
        assert first.i.iloc[5] == 5 and first.f.iloc[5] == 0.0, "the second get wrote over the first's table"
        assert second.i.iloc[5] == -5 and second.f.iloc[5] == 1.0
        at = second.i.to_numpy().__array_interface__["data"][0]
        del second
        third = await session.get_dataframe("df")
        assert third.i.to_numpy().__array_interface__["data"][0] == at, "the freed memory served the next get"
        pd.testing.assert_series_equal(third.i, pd.Series(-np.arange(1_000_000), name="i"))
        assert first.i.iloc[-1] == 999_999
