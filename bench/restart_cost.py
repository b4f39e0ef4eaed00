"""A restart through jupyter_client's KernelManager (what JupyterLab's "Restart Kernel" and
``jupyter console``'s restart do): from ``restart_kernel()`` to the restarted kernel's first
``kernel_info_reply``, ivralo against plain ipykernel, in interleaved pairs (issue 31, Must 9).

    .venv/bin/python bench/harness.py --size smoke --only restart_cost
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent))

from startup_latency import IVRALO, PLAIN, Bench, await_reply, pairs, shutdown

if TYPE_CHECKING:
    from harness_api import Context, Metric


def restart_ms(bench: Bench, kind: str, restarts: int) -> list[float]:
    """One kernel of ``kind``, restarted ``restarts`` times: each restart's time to ready (ms)."""
    km = bench.new_manager(kind)
    kc, _ = bench.start(km)
    times = []
    try:
        for _ in range(restarts):
            t0 = time.perf_counter()
            km.restart_kernel(now=False)
            reply = await_reply(kc, kc.kernel_info(), bench.timeout)  # the restarted kernel answers
            times.append((time.perf_counter() - t0) * 1000)
            assert reply["content"]["status"] == "ok", reply
    finally:
        shutdown(km, kc)
    return times


def harness(ctx: Context) -> list[Metric]:
    from harness_api import LATENCY, Metric

    workspace = ctx.root / "workspace"
    workspace.mkdir()
    bench = Bench(workspace, Path(os.environ["JUPYTER_RUNTIME_DIR"]), ctx.kernel_log, ctx.timeout)
    rounds, each = ctx.pick(smoke=(2, 1), full=(8, 3))
    samples: dict[str, list[float]] = {PLAIN: [], IVRALO: []}
    for index, order in pairs(rounds):
        for kind in order:
            samples[kind] += restart_ms(bench, kind, each)
        ctx.log(f"round {index + 1}/{rounds}: ivralo {samples[IVRALO][-1]:.0f} ms, plain {samples[PLAIN][-1]:.0f} ms")
    restart = "KernelManager.restart_kernel to ready"
    return [Metric("restart", restart, "ms", samples[IVRALO], samples[PLAIN], plot=LATENCY)]
