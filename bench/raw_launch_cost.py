"""What VS Code's way of starting a kernel costs with ivralo: plain ipykernel against ivralo in its
OS sandbox, whose channels are relayed from VS Code's TCP ports to the kernel's ipc sockets.

Both are started as VS Code starts them: kernel.json's argv run directly, with a connection file of
chosen TCP ports, no provisioner. Interleaved (A B, B A, ...) so the machine's drift does not fold
into a ratio. For each: start to ready (``wait_for_ready``), the ``1+1`` round trip (median), and a
cell that prints 1 MB (median), which measures the IOPub relay's throughput.

Run: ``.venv/bin/python bench/raw_launch_cost.py [--starts N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.connect import write_connection_file

from ivralo_kernel.host.jupyter.kernelspec import kernel_spec_dict

KINDS = ("plain", "ivralo-raw")
BIG_OUTPUT = "print('x' * 1_000_000)"


def argv_for(kind: str, connection_file: str) -> tuple[list[str], dict[str, str]]:
    if kind == "plain":  # python3's kernel.json, with this interpreter (VS Code uses the chosen one)
        return [sys.executable, "-m", "ipykernel_launcher", "-f", connection_file], {}
    spec_dict = kernel_spec_dict(python=sys.executable)
    return [part.format(connection_file=connection_file) for part in spec_dict["argv"]], spec_dict["env"]


def until_idle(kc: BlockingKernelClient, code: str) -> float:
    started = time.perf_counter()
    msg_id = kc.execute(code)
    while True:
        msg = kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    reply = kc.get_shell_msg(timeout=60)
    assert reply["content"]["status"] == "ok", reply["content"]
    return time.perf_counter() - started


def one_kernel(kind: str, round_trips: int) -> dict[str, float]:
    workspace = tempfile.mkdtemp(prefix="ivralo-bench-")
    runtime = tempfile.mkdtemp(prefix="ivralo-bench-runtime-")
    connection_file, _ = write_connection_file(os.path.join(runtime, "kernel-bench.json"))
    argv, extra_env = argv_for(kind, connection_file)
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=workspace, env={**os.environ, **extra_env}, stdin=subprocess.DEVNULL)
    kc = BlockingKernelClient(connection_file=connection_file)
    kc.load_connection_file()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        ready = time.perf_counter() - started
        until_idle(kc, "1+1")
        rtt = [until_idle(kc, "1+1") for _ in range(round_trips)]
        big = [until_idle(kc, BIG_OUTPUT) for _ in range(max(3, round_trips // 5))]
    finally:
        kc.stop_channels()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    return {"ready_s": ready, "rtt_s": statistics.median(rtt), "big_output_s": statistics.median(big)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", type=int, default=6)
    parser.add_argument("--round-trips", type=int, default=40)
    args = parser.parse_args()
    samples: dict[str, list[dict[str, float]]] = {k: [] for k in KINDS}
    for trial in range(args.starts):
        for kind in KINDS if trial % 2 == 0 else tuple(reversed(KINDS)):
            samples[kind].append(one_kernel(kind, args.round_trips))
    summary = {k: {key: statistics.median(s[key] for s in samples[k]) for key in samples[k][0]} for k in KINDS}
    plain = summary["plain"]
    print(f"{'kind':12} {'ready ms':>9} {'x':>6} {'1+1 ms':>8} {'x':>6} {'1 MB out ms':>12} {'x':>6}")
    for kind in KINDS:
        s = summary[kind]
        print(
            f"{kind:12} {s['ready_s'] * 1000:9.0f} {s['ready_s'] / plain['ready_s']:6.2f} {s['rtt_s'] * 1000:8.2f} "
            f"{s['rtt_s'] / plain['rtt_s']:6.2f} {s['big_output_s'] * 1000:12.1f} "
            f"{s['big_output_s'] / plain['big_output_s']:6.2f}"
        )
    out = Path(__file__).parent / "results" / f"raw_launch_cost-{int(time.time())}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"summary": summary, "samples": samples}, indent=1))
    print(f"samples: {out}")


if __name__ == "__main__":
    main()
