"""A 100 MB DataFrame into a worker and back: ivralo's Arrow over shared memory, plain ipykernel's best
path (pickle protocol 5 with out-of-band buffers, as binary frames of a comm message), the old JSON
path, and an in-process copy (the physical limit). Throughput in MB/s of the frame's bytes.

    .venv/bin/python bench/dataframe_transfer.py [--trials N] [--mb 100] [--json-mb 4]

Each Jupyter folder points into a temporary directory; the ivralo kernelspec is installed there.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import pickle
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from harness_api import Context, Metric

PICKLE_TARGET = r"""
import pickle
def _bench_target(comm, open_msg):
    @comm.on_msg
    def _on(msg):
        data = msg["content"]["data"]
        if data["op"] == "put":
            buffers = msg["buffers"]
            globals()[data["name"]] = pickle.loads(buffers[0], buffers=buffers[1:]).copy()
            comm.send({"op": "done"})
        else:
            out = []
            head = pickle.dumps(globals()[data["name"]], protocol=5, buffer_callback=out.append)
            comm.send({"op": "done"}, buffers=[head, *[b.raw() for b in out]])
get_ipython().kernel.comm_manager.register_target("bench", _bench_target)
"""


def frame_of(megabytes: float) -> pd.DataFrame:
    rows = int(megabytes * 2**20 / 16)
    rng = np.random.default_rng(14)
    return pd.DataFrame({"id": np.arange(rows, dtype=np.int64), "value": rng.random(rows)})


def mb(frame: pd.DataFrame) -> float:
    return float(frame.memory_usage(index=False).sum()) / 1e6


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = call()
    return time.perf_counter() - start, value


def rate(megabytes: float, seconds: list[float]) -> dict[str, float]:
    return {
        "median_mb_s": round(megabytes / statistics.median(seconds)),
        "best_mb_s": round(megabytes / min(seconds)),
        "median_ms": round(1000 * statistics.median(seconds), 1),
    }


def in_process(frame: pd.DataFrame, trials: int) -> dict[str, Any]:
    copies = [timed(lambda: frame.copy(deep=True))[0] for _ in range(trials)]
    source, target = frame["value"].to_numpy(), np.empty(len(frame))
    np.copyto(target, source)
    memcpy = [timed(lambda: np.copyto(target, source))[0] for _ in range(trials)]
    return {"df.copy()": rate(mb(frame), copies), "memcpy (warm pages)": rate(frame["value"].nbytes / 1e6, memcpy)}


async def ivralo(frame: pd.DataFrame, trials: int, workspace: str) -> dict[str, Any]:
    from ivralo_kernel.host import Session

    into: list[float] = []
    back: list[float] = []
    cold: dict[str, float] = {}
    async with Session(workspace=workspace) as session:
        await session.run("import pandas, pyarrow")  # the kernel's imports are not the transfer's
        for trial in range(trials + 1):
            start = time.perf_counter()
            await session.inject_dataframe("df", frame)
            middle = time.perf_counter()
            result = await session.get_dataframe("df")
            end = time.perf_counter()
            assert result.equals(frame)
            del result
            if trial == 0:  # the first allocates the shared segment's pages: reported on its own
                cold = {"in_ms": round(1000 * (middle - start), 1), "out_ms": round(1000 * (end - middle), 1)}
            else:
                into.append(middle - start)
                back.append(end - middle)
        provisioner = session._worker.km.provisioner if session._worker else None
        sandbox = "bwrap" if getattr(provisioner, "sandboxed", False) else getattr(provisioner, "sandbox_reason", "?")
    return {"in": rate(mb(frame), into), "out": rate(mb(frame), back), "first_transfer": cold, "sandbox": sandbox}


class PlainKernel:
    """ipykernel's own ``python3`` kernel, reached with jupyter_client's blocking client."""

    def __init__(self) -> None:
        from jupyter_client.manager import KernelManager

        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel()
        self.kc = self.km.blocking_client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        self.execute(PICKLE_TARGET + "\nimport pandas, io, json")
        self.comm_id = os.urandom(8).hex()
        self._send("comm_open", {"comm_id": self.comm_id, "target_name": "bench", "data": {}})

    def execute(self, code: str, expressions: dict[str, str] | None = None) -> dict[str, Any]:
        msg_id = self.kc.execute(code, silent=True, user_expressions=expressions or {})
        while True:
            reply = self.kc.get_shell_msg(timeout=120)
            if reply["parent_header"].get("msg_id") == msg_id:
                assert reply["content"]["status"] == "ok", reply["content"]
                return dict(reply["content"])

    def _send(self, msg_type: str, content: dict[str, Any], buffers: list[Any] | None = None) -> str:
        msg = self.kc.session.msg(msg_type, content)
        if buffers:
            msg["buffers"] = buffers
        self.kc.shell_channel.send(msg)
        return str(msg["header"]["msg_id"])

    def comm(self, data: dict[str, Any], buffers: list[Any] | None = None) -> list[Any]:
        msg_id = self._send("comm_msg", {"comm_id": self.comm_id, "data": data}, buffers)
        while True:
            msg = self.kc.get_iopub_msg(timeout=120)
            if msg["parent_header"].get("msg_id") == msg_id and msg["header"]["msg_type"] == "comm_msg":
                return list(msg.get("buffers") or [])

    def put(self, name: str, frame: pd.DataFrame) -> None:
        out: list[Any] = []
        head = pickle.dumps(frame, protocol=5, buffer_callback=out.append)
        self.comm({"op": "put", "name": name}, [head, *[b.raw() for b in out]])

    def get(self, name: str) -> pd.DataFrame:
        buffers = self.comm({"op": "get", "name": name})
        return pickle.loads(buffers[0], buffers=buffers[1:]).copy()  # the bench's own kernel

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def plain_pickle(kernel: PlainKernel, frame: pd.DataFrame, trials: int) -> dict[str, Any]:
    kernel.put("df", frame)
    kernel.get("df")  # warm-up
    into = [timed(lambda: kernel.put("df", frame))[0] for _ in range(trials)]
    back: list[float] = []
    for _ in range(trials):
        seconds, result = timed(lambda: kernel.get("df"))
        back.append(seconds)
        assert result.equals(frame)
    return {"in": rate(mb(frame), into), "out": rate(mb(frame), back)}


def plain_json(kernel: PlainKernel, frame: pd.DataFrame, trials: int) -> dict[str, Any]:
    """The old ``inject_dataframe`` (JSON, split orientation, inside the code) and its way back."""

    def put() -> None:
        payload = frame.to_json(orient="split")
        kernel.execute(f"df = pandas.read_json(io.StringIO({payload!r}), orient='split')")

    def get() -> pd.DataFrame:
        content = kernel.execute("pass", {"v": "df.to_json(orient='split')"})
        text = json.loads(json.dumps(content["user_expressions"]["v"]["data"]["text/plain"]))
        import ast

        return pd.read_json(io.StringIO(ast.literal_eval(text)), orient="split")

    into = [timed(put)[0] for _ in range(trials)]
    back = [timed(get)[0] for _ in range(trials)]
    return {"in": rate(mb(frame), into), "out": rate(mb(frame), back)}


def _times(frame: pd.DataFrame, trials: int, workspace: str) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per-trial seconds, in and out: ivralo's Arrow path, then plain ipykernel's pickle-5 over a comm."""

    async def ours() -> dict[str, list[float]]:
        from ivralo_kernel.host import Session

        into: list[float] = []
        back: list[float] = []
        async with Session(workspace=workspace) as session:
            await session.run("import pandas, pyarrow")
            await session.inject_dataframe("df", frame)  # the first allocates the segment's pages
            for _ in range(trials):
                into.append(await _timed_async(session.inject_dataframe("df", frame)))
                back.append(await _timed_async(session.get_dataframe("df")))
        return {"in": into, "out": back}

    ivralo_times = asyncio.run(ours())
    kernel = PlainKernel()
    try:
        kernel.put("df", frame)
        kernel.get("df")
        plain = {
            "in": [timed(lambda: kernel.put("df", frame))[0] for _ in range(trials)],
            "out": [timed(lambda: kernel.get("df"))[0] for _ in range(trials)],
        }
    finally:
        kernel.close()
    return ivralo_times, plain


async def _timed_async(call: Any) -> float:
    start = time.perf_counter()
    await call
    return time.perf_counter() - start


FIRST_TABLE_BASELINE = "the first session of a pool that never moved a table (imports at first use)"


def _first_tables(frame: pd.DataFrame, trials: int, workspace: str) -> tuple[list[float], list[float]]:
    """Seconds of a fresh session's first call, ``inject_dataframe`` of ``frame``, in pairs (the order
    alternating): on a spare of a pool whose sessions have moved tables (so the spare imported the
    data plane's modules while it waited: ``WorkerPool.note_tables``), and on the spare of a new pool
    (the baseline: it imports them in that first call, as every session did before). Both sessions
    are fresh: a new kernel, a new exchange segment (its pages allocated in the timed call)."""
    from ivralo_kernel.host import Session, WorkerConfig, WorkerPool

    config = WorkerConfig(prewarm_pool_size=1)

    async def first(pool: WorkerPool) -> float:
        await pool.wait_prewarmed()
        async with Session(pool=pool) as session:
            start = time.perf_counter()
            await session.inject_dataframe("df", frame)  # the session's first call: it takes the spare
            return time.perf_counter() - start

    async def pairs() -> tuple[list[float], list[float]]:
        warm: list[float] = []
        cold: list[float] = []
        async with WorkerPool(workspace, config=config) as used:
            async with Session(pool=used) as session:  # a session of this pool moves a table
                await session.inject_dataframe("df", frame.iloc[:10])
            for trial in range(trials):
                for side in ("warm", "cold") if trial % 2 == 0 else ("cold", "warm"):
                    if side == "warm":
                        warm.append(await first(used))
                    else:
                        async with WorkerPool(workspace, config=config) as fresh:
                            cold.append(await first(fresh))
        return warm, cold

    return asyncio.run(pairs())


def harness(ctx: Context) -> list[Metric]:
    """Arrow over shared memory against plain ipykernel's pickle-5 over a comm, per transfer (ms); a
    fresh session's first table (MB/s) against a pool's first session."""
    from harness_api import Metric

    megabytes, trials = ctx.pick(smoke=(5, 2), full=(100, 5))
    frame = frame_of(megabytes)
    workspace = ctx.root / "ws-dataframe"
    workspace.mkdir()
    ours, plain = _times(frame, trials, str(workspace))
    first_mb = ctx.pick(smoke=5, full=48)
    first_frame = frame_of(first_mb)
    warm, cold = _first_tables(first_frame, trials, str(workspace))
    label = "pickle-5 over a comm (plain ipykernel)"
    return [
        Metric(
            "DataFrame transport",
            f"a fresh session's first {first_mb} MB table",
            "MB/s",
            [mb(first_frame) / t for t in warm],
            [mb(first_frame) / t for t in cold],
            baseline_label=FIRST_TABLE_BASELINE,
        ),
        Metric(
            "DataFrame transport",
            f"{megabytes} MB in (inject_dataframe)",
            "ms",
            [1000 * t for t in ours["in"]],
            [1000 * t for t in plain["in"]],
            baseline_label=label,
            plot="latency",
        ),
        Metric(
            "DataFrame transport",
            f"{megabytes} MB out (get_dataframe)",
            "ms",
            [1000 * t for t in ours["out"]],
            [1000 * t for t in plain["out"]],
            baseline_label=label,
            plot="latency",
        ),
    ]


def isolate(base: Path) -> None:
    for var, sub in (("JUPYTER_CONFIG_DIR", "config"), ("JUPYTER_DATA_DIR", "data"), ("JUPYTER_RUNTIME_DIR", "run")):
        (base / sub).mkdir()
        os.environ[var] = str(base / sub)
    os.environ["IPYTHONDIR"] = str(base / "ipython")
    from ivralo_kernel.cli.install import install

    install(prefix=str(base / "prefix"))
    os.environ["JUPYTER_PATH"] = str(base / "prefix" / "share" / "jupyter")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--mb", type=float, default=100.0, help="size of the frame (MiB of column data)")
    parser.add_argument("--json-mb", type=float, default=4.0, help="size of the JSON path's frame (it is slow)")
    parser.add_argument("--results-dir", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ivralo-bench-"))
    isolate(base)
    workspace = base / "workspace"
    workspace.mkdir()
    frame = frame_of(args.mb)
    print(f"frame: {len(frame):,} rows x 2 columns, {mb(frame):.1f} MB; {args.trials} trials", file=sys.stderr)
    results: dict[str, Any] = {"frame_mb": round(mb(frame), 1), "trials": args.trials}
    results["in_process"] = in_process(frame, args.trials)
    results["ivralo_arrow_shm"] = asyncio.run(ivralo(frame, args.trials, str(workspace)))
    kernel = PlainKernel()
    try:
        results["plain_pickle_channel"] = plain_pickle(kernel, frame, args.trials)
        results["plain_json"] = plain_json(kernel, frame_of(args.json_mb), max(1, min(args.trials, 3)))
    finally:
        kernel.close()
    arrow, pickled, js = results["ivralo_arrow_shm"], results["plain_pickle_channel"], results["plain_json"]
    copy = results["in_process"]["df.copy()"]["median_mb_s"]
    results["ratios"] = {
        way: {
            "arrow_vs_pickle": round(arrow[way]["median_mb_s"] / pickled[way]["median_mb_s"], 2),
            "arrow_vs_json": round(arrow[way]["median_mb_s"] / js[way]["median_mb_s"], 1),
            "arrow_vs_in_process_copy": round(arrow[way]["median_mb_s"] / copy, 2),
        }
        for way in ("in", "out")
    }
    print(f"{'path':34s} {'in MB/s':>9s} {'out MB/s':>9s}")
    for label, row in (("ivralo Arrow, shared memory", arrow), ("ipykernel pickle-5, comm", pickled), ("JSON", js)):
        print(f"{label:34s} {row['in']['median_mb_s']:9d} {row['out']['median_mb_s']:9d}")
    print(f"{'in-process df.copy()':34s} {copy:9d}")
    print(json.dumps(results["ratios"]))
    out = Path(args.results_dir)
    out.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    (out / f"dataframe_transfer-{stamp}.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
