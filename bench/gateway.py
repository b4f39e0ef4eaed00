"""An ivralo kernel through a Jupyter Kernel Gateway on loopback against a local one, pair by pair:
start to ready (``Session`` created to its first ``pass`` answered), the ``1+1`` round trip, and a
DataFrame's MB/s in (``inject_dataframe``) and out (``get_dataframe``). Locally the table travels
through shared memory; through the gateway as binary websocket buffers (host/agent/gateway/worker.py).

    .venv/bin/python bench/gateway.py [--trials N] [--mb 100] [--round-trips 50]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from harness_api import Context, Metric

GATEWAY = "through a Kernel Gateway"
LOCAL = "local Session"


@contextmanager
def kernel_gateway(root: Path) -> Iterator[str]:
    """KG on 127.0.0.1 (test-infrastructure.md §3a); yields the URL with its token once /api answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    token = uuid.uuid4().hex
    cmd = [
        sys.executable, "-m", "kernel_gateway", "--KernelGatewayApp.ip=127.0.0.1",
        f"--KernelGatewayApp.port={port}", "--KernelGatewayApp.port_retries=0",
        f"--KernelGatewayApp.auth_token={token}",
        # As docs/agents.md says to run it: each websocket frame sent at once (TCP_NODELAY).
        "--KernelGatewayApp.kernel_websocket_connection_class="
        "ivralo_kernel.host.jupyter.prompt_websocket.PromptKernelWebsocketConnection",
    ]  # fmt: skip
    with open(root / "kernel-gateway.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the kernel gateway exited; see {root / 'kernel-gateway.log'}")
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/api", headers={"Authorization": f"token {token}"}
            )
            try:
                with urllib.request.urlopen(request, timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the kernel gateway did not come up in 60 s")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/?token={token}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def frame_of(megabytes: float) -> pd.DataFrame:
    rows = int(megabytes * 2**20 / 16)
    rng = np.random.default_rng(16)
    return pd.DataFrame({"id": np.arange(rows, dtype=np.int64), "value": rng.random(rows)})


async def one_trial(workspace: str, gateway_url: str | None, frame: pd.DataFrame, round_trips: int) -> dict[str, Any]:
    from ivralo_kernel.host import Session

    megabytes = float(frame.memory_usage(index=False).sum()) / 1e6
    started = time.perf_counter()
    async with Session(workspace, gateway_url=gateway_url) as session:
        assert await session.run("pass") == ""
        ready = time.perf_counter() - started
        trips = []
        for _ in range(round_trips):
            t0 = time.perf_counter()
            assert await session.run("1+1") == "2\n"
            trips.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await session.inject_dataframe("df", frame)
        inbound = megabytes / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        back = await session.get_dataframe("df")
        outbound = megabytes / (time.perf_counter() - t0)
        assert back.shape == frame.shape
    return {"ready": ready, "trips": trips, "in": inbound, "out": outbound}


def run(trials: int, megabytes: float, round_trips: int, root: Path) -> dict[str, list[dict[str, Any]]]:
    frame = frame_of(megabytes)
    workspace = root / "ws-gateway"
    workspace.mkdir(exist_ok=True)
    results: dict[str, list[dict[str, Any]]] = {LOCAL: [], GATEWAY: []}
    with kernel_gateway(root) as url:
        for i in range(trials):  # A B, then B A: the machine's drift cancels in each pair's ratio
            order = [(GATEWAY, url), (LOCAL, None)] if i % 2 == 0 else [(LOCAL, None), (GATEWAY, url)]
            for label, gateway_url in order:
                results[label].append(asyncio.run(one_trial(str(workspace), gateway_url, frame, round_trips)))
    return results


def harness(ctx: Context) -> list[Metric]:
    from harness_api import Metric

    megabytes, trials, trips = ctx.pick(smoke=(1, 1, 5), full=(100, 5, 50))
    r = run(trials, megabytes, trips, ctx.root)
    g, loc = r[GATEWAY], r[LOCAL]
    return [
        Metric("gateway", "start to ready", "ms", [1000 * t["ready"] for t in g], [1000 * t["ready"] for t in loc],
               baseline_label=LOCAL, plot="latency"),
        Metric("gateway", "1+1 round trip (median of a trial)", "ms",
               [1000 * statistics.median(t["trips"]) for t in g], [1000 * statistics.median(t["trips"]) for t in loc],
               baseline_label=LOCAL, plot="latency"),
        Metric("gateway", f"{megabytes} MB DataFrame in", "MB/s", [t["in"] for t in g], [t["in"] for t in loc],
               baseline_label=LOCAL),
        Metric("gateway", f"{megabytes} MB DataFrame out", "MB/s", [t["out"] for t in g], [t["out"] for t in loc],
               baseline_label=LOCAL),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--mb", type=float, default=100)
    parser.add_argument("--round-trips", type=int, default=50)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from startup_latency import isolate_jupyter

    with tempfile.TemporaryDirectory(prefix="ivralo-bench-gateway-") as tmp:
        isolate_jupyter(Path(tmp))
        r = run(args.trials, args.mb, args.round_trips, Path(tmp))
    for label, trials in r.items():
        ready = [1000 * t["ready"] for t in trials]
        trips = [1000 * x for t in trials for x in t["trips"]]
        p95 = statistics.quantiles(trips, n=20)[-1] if len(trips) > 1 else trips[0]
        print(
            f"{label:26} start to ready {statistics.median(ready):7.0f} ms | "
            f"1+1 median {statistics.median(trips):6.2f} "
            f"ms p95 {p95:6.2f} ms | {args.mb:g} MB in {statistics.median([t['in'] for t in trials]):7.0f} MB/s, "
            f"out {statistics.median([t['out'] for t in trials]):7.0f} MB/s"
        )
    for i, (g, loc) in enumerate(zip(r[GATEWAY], r[LOCAL], strict=True)):
        ratios = (g["ready"] / loc["ready"], g["in"] / loc["in"], g["out"] / loc["out"])
        print(f"pair {i}: start {ratios[0]:.2f}x, in {ratios[1]:.2f}x, out {ratios[2]:.2f}x")


if __name__ == "__main__":
    main()
