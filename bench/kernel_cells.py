"""A run of 100 cells, a cell printing 1 MB, and an interrupt: ivralo against plain ipykernel.

One ready kernel of each kind (``ivralo`` kernelspec and ipykernel's ``python3``, the same
``jupyter_client.KernelManager``), both alive together; every measurement alternates between them
(A B, then B A, ...), so the machine's drift cancels in each pair's ratio.

* **100 cells**: 100 executions of ``x = i`` one after another, each awaited until its
  ``execute_reply`` and ``status: idle`` (what a notebook's "run all" does); the time for all 100.
* **1 MB output**: ``print('x' * 1_000_000)`` until reply and idle: the IOPub path's throughput
  (ivralo relays the kernel's channels; plain ipykernel has none).
* **interrupt**: a cell prints a line and then spins (``while True: pass``); once the line has
  arrived, ``KernelManager.interrupt_kernel()`` is called, and the time until the cell's
  ``execute_reply`` (a ``KeyboardInterrupt`` error) is measured.

Run alone: ``.venv/bin/python bench/kernel_cells.py [--smoke]`` (prints the harness's table for this
module); normally ``make bench`` runs it through ``bench/harness.py``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness_api import LATENCY, Context, Metric
from startup_latency import IVRALO, KINDS, PLAIN, Bench, await_reply, drain, pairs, shutdown

if TYPE_CHECKING:
    from jupyter_client.blocking.client import BlockingKernelClient
    from jupyter_client.manager import KernelManager

BIG_OUTPUT = "print('x' * 1_000_000)"
SPIN = "print('spinning', flush=True)\nwhile True: pass"


def hundred_cells(bench: Bench, kc: BlockingKernelClient, cells: int) -> float:
    t0 = time.perf_counter()
    for i in range(cells):
        bench.roundtrip(kc, f"x = {i}")
    return (time.perf_counter() - t0) * 1000


def interrupt(km: KernelManager, kc: BlockingKernelClient, timeout: float) -> float:
    """ms from ``interrupt_kernel()`` to the spinning cell's error reply (and its idle)."""
    drain(kc.iopub_channel)
    msg_id = kc.execute(SPIN)
    deadline = time.monotonic() + timeout
    while True:  # the handshake: the cell is running once its line has arrived
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the spinning cell never printed")
        msg: dict[str, Any] = kc.get_iopub_msg(timeout=remaining)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
            break
    t0 = time.perf_counter()
    km.interrupt_kernel()
    reply = await_reply(kc, msg_id, timeout)
    elapsed = (time.perf_counter() - t0) * 1000
    if reply["content"].get("ename") != "KeyboardInterrupt":
        raise RuntimeError(f"the interrupt ended the cell with {reply['content']}")
    while True:  # and the kernel is idle again before the next measurement
        msg = kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") == msg_id and msg["content"].get("execution_state") == "idle":
            return elapsed


def harness(ctx: Context) -> list[Metric]:
    workspace = ctx.root / "workspace"
    workspace.mkdir()
    bench = Bench(workspace, Path(os.environ["JUPYTER_RUNTIME_DIR"]), ctx.kernel_log, ctx.timeout)
    cells, batches = 100, ctx.pick(smoke=2, full=8)
    outputs, interrupts = ctx.pick(smoke=3, full=20), ctx.pick(smoke=2, full=20)
    samples: dict[str, dict[str, list[float]]] = {k: {"cells": [], "output": [], "interrupt": []} for k in KINDS}
    managers: dict[str, KernelManager] = {}
    clients: dict[str, BlockingKernelClient] = {}
    try:
        for kind in KINDS:
            managers[kind] = bench.new_manager(kind)
            clients[kind], _ = bench.start(managers[kind])
            bench.roundtrip(clients[kind], BIG_OUTPUT)  # warm-up
        for _, order in pairs(batches):
            for kind in order:
                samples[kind]["cells"].append(hundred_cells(bench, clients[kind], cells))
        ctx.log(f"  {batches} batches of {cells} cells per kind done")
        for _, order in pairs(outputs):
            for kind in order:
                samples[kind]["output"].append(bench.roundtrip(clients[kind], BIG_OUTPUT)["roundtrip_ms"])
        ctx.log(f"  {outputs} x 1 MB output per kind done")
        for _, order in pairs(interrupts):
            for kind in order:
                samples[kind]["interrupt"].append(interrupt(managers[kind], clients[kind], ctx.timeout))
        ctx.log(f"  {interrupts} interrupts per kind done")
    finally:
        for kind, km in managers.items():
            shutdown(km, clients.get(kind))
    iv, pl = samples[IVRALO], samples[PLAIN]
    return [
        Metric("100 cells", f"{cells} x `x = i`, all until idle", "ms", iv["cells"], pl["cells"], plot=LATENCY),
        Metric("1 MB output", "`print('x' * 1_000_000)` until idle", "ms", iv["output"], pl["output"], plot=LATENCY),
        Metric(
            "interrupt",
            "interrupt_kernel() to the KeyboardInterrupt reply",
            "ms",
            iv["interrupt"],
            pl["interrupt"],
            plot=LATENCY,
        ),
    ]


if __name__ == "__main__":
    size = "smoke" if "--smoke" in sys.argv else "full"
    sys.exit(__import__("harness").main(["--only", "kernel_cells", "--size", size]))
