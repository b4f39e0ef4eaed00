"""Warm-pool first-call latency vs a cold start, for the agent API.

A session's first ``run("1+1")`` when the pool has a prewarmed, ready spare, against the same
first call when the session has to start its own worker. Cold and warm trials are interleaved
(this machine is noisy); medians and p95 are reported. Target: warm first call <= 50 ms p50.

    .venv/bin/python bench/warm_pool.py [--trials N] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from harness_api import Context, Metric


def isolate() -> Path:
    base = Path(tempfile.mkdtemp(prefix="ivralo-bench-"))
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        (base / var).mkdir()
        os.environ[var] = str(base / var)
    os.environ["JUPYTER_PLATFORM_DIRS"] = "1"
    (base / "ws").mkdir()
    return base


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def main(trials: int) -> dict[str, object]:

    base = isolate()
    try:
        return await measure(base / "ws", trials)
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def measure(workspace: Path, trials: int) -> dict[str, object]:
    from ivralo_kernel.host import Session, WorkerConfig, WorkerPool

    warm: list[float] = []
    cold: list[float] = []
    async with WorkerPool(workspace, config=WorkerConfig(prewarm_pool_size=1)) as pool:
        for trial in range(trials):
            print(f"trial {trial + 1}/{trials}", file=sys.stderr)
            await pool.wait_prewarmed()
            async with Session(pool=pool) as session:
                start = time.perf_counter()
                assert await session.run("1+1") == "2\n"
                warm.append((time.perf_counter() - start) * 1000)
            async with Session(workspace=workspace) as session:
                start = time.perf_counter()
                assert await session.run("1+1") == "2\n"
                cold.append((time.perf_counter() - start) * 1000)
    result = {
        "trials": trials,
        "samples": {"warm_ms": warm, "cold_ms": cold},
        "warm_ms": {"median": statistics.median(warm), "p95": pct(warm, 0.95), "max": max(warm)},
        "cold_ms": {"median": statistics.median(cold), "p95": pct(cold, 0.95), "max": max(cold)},
    }
    print(f"first call of a session, {trials} trials each (ms)     median      p95      max")
    for name in ("warm", "cold"):
        stats = result[f"{name}_ms"]
        assert isinstance(stats, dict)
        print(
            f"  {name} ({'prewarmed spare' if name == 'warm' else 'starts its own worker'}):"
            f"{stats['median']:>22.1f} {stats['p95']:>8.1f} {stats['max']:>8.1f}"
        )
    warm_ms = result["warm_ms"]
    assert isinstance(warm_ms, dict)
    print(f"target warm p50 <= 50 ms: {'MET' if warm_ms['median'] <= 50 else 'MISSED'}")
    return result


def harness(ctx: Context) -> list[Metric]:
    """A session's first run("1+1") on a prewarmed spare against a cold start, paired by trial."""
    from harness_api import Metric

    workspace = ctx.root / "ws"
    workspace.mkdir()
    result = asyncio.run(measure(workspace, ctx.pick(smoke=1, full=8)))
    samples = result["samples"]
    assert isinstance(samples, dict)
    return [
        Metric(
            "warm pool",
            "a session's first run('1+1'), prewarmed spare",
            "ms",
            samples["warm_ms"],
            samples["cold_ms"],
            baseline_label="the session starts its own worker",
        ),
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="3 trials")
    args = parser.parse_args()
    outcome = asyncio.run(main(3 if args.quick else args.trials))
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    path = out / f"warm_pool-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps(outcome, indent=1))
    print(f"written {path}")
