"""N kernels started at once (1, 2, 4, 8, 16): the time until all of them are ready.

For each N, N kernels of one kind are started together by jupyter_client's ``AsyncKernelManager``
(``ivralo`` kernelspec, in its OS sandbox where it can be built, or ipykernel's ``python3``), each
in a workspace of its own; the time is from the first ``start_kernel()`` until the last
``wait_for_ready()`` has returned (which includes jupyter_client's 0.2 s IOPub drain, for both
kinds). Then all N run ``1+1`` at once, and are shut down together before the other kind starts.
The kinds alternate per repetition (A B, then B A), so each pair's ratio is taken on the same load.

On this 2-core machine 16 kernels at once is a queue for the CPU: the number says how the start-up
work (the supervisor, the sandbox, the relays) adds up, not how a bigger machine behaves.

Run alone: ``.venv/bin/python bench/concurrency.py [--smoke]`` (through ``bench/harness.py``).
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from typing import Any

from harness_api import CONCURRENCY, Context, Metric
from startup_latency import IVRALO, KERNEL_NAMES, KINDS, PLAIN, pairs

PORT_RACE_ATTEMPTS = 3


async def start_one(kind: str, ctx: Context, started: list[Any]) -> None:
    from jupyter_client.manager import AsyncKernelManager

    workspace = ctx.root / f"ws-{uuid.uuid4().hex[:8]}"
    workspace.mkdir()
    km = AsyncKernelManager(kernel_name=KERNEL_NAMES[kind])
    index = len(started)  # the others append while this one awaits
    started.append((km, None))
    await km.start_kernel(cwd=str(workspace), stdout=ctx.kernel_log, stderr=ctx.kernel_log)
    kc = km.client()
    started[index] = (km, kc)
    kc.start_channels()
    await kc.wait_for_ready(timeout=ctx.timeout * 4)  # 16 starts queue for 2 cores


async def round_trip(kc: Any, timeout: float) -> None:
    reply = await kc.execute_interactive("1+1", timeout=timeout, output_hook=lambda _msg: None)
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"1+1 failed: {reply['content']}")


async def together(kind: str, n: int, ctx: Context) -> tuple[float, float]:
    """ms until all ``n`` are ready; ms until all ``n`` answered their first ``1+1``, sent at once."""
    started: list[Any] = []
    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(start_one(kind, ctx, started) for _ in range(n)))
        ready = (time.perf_counter() - t0) * 1000
        t1 = time.perf_counter()
        await asyncio.gather(*(round_trip(kc, ctx.timeout) for _, kc in started))
        return ready, (time.perf_counter() - t1) * 1000
    finally:
        for _, kc in started:
            if kc is not None:
                kc.stop_channels()
        # A manager whose start failed raises here too; run_bench reaps whatever is left at the end.
        await asyncio.gather(
            *(km.shutdown_kernel(now=True) for km, _ in started if km.has_kernel), return_exceptions=True
        )


async def together_retrying(kind: str, n: int, ctx: Context) -> tuple[float, float]:
    """``together``, again when a port was taken: jupyter_client picks free TCP ports and the kernel
    (ivralo: its relay) binds them later; with 16 starts in flight on a loaded machine, another
    process (or one of this one's outgoing connections) can take one in between. The same for both
    kinds, and not what this bench measures: the repetition runs again, and the note says so."""
    for attempt in range(1, PORT_RACE_ATTEMPTS + 1):
        try:
            return await together(kind, n, ctx)
        except Exception as exc:
            if "Address already in use" not in repr(exc) or attempt == PORT_RACE_ATTEMPTS:
                raise
            ctx.notes.append(f"{kind}, {n} at once: a port was taken between its choice and its bind; run again")
            ctx.log(f"  {kind}, {n} at once: {exc!r}; again")
    raise AssertionError("unreachable")


async def measure(ctx: Context, levels: tuple[int, ...], reps: int) -> list[Metric]:
    metrics = []
    for n in levels:
        ready: dict[str, list[float]] = {kind: [] for kind in KINDS}
        rtt: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for _, order in pairs(reps):
            for kind in order:
                r, t = await together_retrying(kind, n, ctx)
                ready[kind].append(r)
                rtt[kind].append(t)
        shown = {kind: ", ".join(f"{v:.0f}" for v in ready[kind]) for kind in KINDS}
        ctx.log(f"  {n} at once, ms until all ready: ivralo {shown[IVRALO]}; plain {shown[PLAIN]}")
        metrics.append(
            Metric(
                "concurrency",
                f"{n} started at once: all ready",
                "ms",
                ready[IVRALO],
                ready[PLAIN],
                plot=CONCURRENCY,
                level=n,
            )
        )
        metrics.append(
            Metric("concurrency", f"{n} at once: first 1+1 of each, all answered", "ms", rtt[IVRALO], rtt[PLAIN])
        )
    return metrics


def harness(ctx: Context) -> list[Metric]:
    levels = ctx.pick(smoke=(1, 2), full=(1, 2, 4, 8, 16))
    return asyncio.run(measure(ctx, levels, ctx.pick(smoke=1, full=4)))


if __name__ == "__main__":
    size = "smoke" if "--smoke" in sys.argv else "full"
    sys.exit(__import__("harness").main(["--only", "concurrency", "--size", size]))
