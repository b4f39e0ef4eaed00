"""Where a ``1+1`` cell's CPU goes, by process and by thread: plain ipykernel and the ivralo kernel
(defaults: sandbox, relay, effects report, deadline), each driven by the same client in this
process for ``--cells`` round trips (reply and idle, as ``startup_latency``'s row).

For each kind it prints the wall time per cell, then the CPU per cell of this process (the client,
and for ivralo the provisioner's threads: the watchdog, the channel relay's, the history recorder,
libzmq's I/O threads, shown as ``?``), and of each process of the kernel's tree (for ivralo: bwrap,
the supervisor, the kernel). CPU is read from /proc (``psutil``), so it counts what each part
costs the machine, not only what lands on the reply's way; on 2 cores the two are close.

Diagnostic only: ``make bench`` does not run it.
Run: ``.venv/bin/python bench/cpu_per_cell.py [--cells N]`` (~30 s at the default 500).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _cpu(proc: psutil.Process) -> float:
    try:
        times = proc.cpu_times()
    except psutil.Error:
        return 0.0
    return float(times.user + times.system)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", type=int, default=500)
    args = parser.parse_args()
    cells = args.cells
    with tempfile.TemporaryDirectory(prefix="ivralo-cpu-per-cell-") as tmp:
        root = Path(tmp)
        from startup_latency import Bench, isolate_jupyter, shutdown

        isolate_jupyter(root / "jupyter")
        (root / "workspace").mkdir()
        (root / "runtime").mkdir()
        me = psutil.Process()
        with open(root / "kernels.log", "wb") as log:
            bench = Bench(root / "workspace", root / "runtime", log, timeout=60)
            for kind in ("plain", "ivralo"):
                km = bench.new_manager(kind)
                kc, _ = bench.start(km)
                try:
                    for _ in range(30):  # warm-up
                        bench.roundtrip(kc)
                    tree = me.children(recursive=True)
                    tree_before = {proc.pid: _cpu(proc) for proc in tree}
                    threads_before = {t.id: t.user_time + t.system_time for t in me.threads()}
                    own_before, started = _cpu(me), time.perf_counter()
                    for _ in range(cells):
                        bench.roundtrip(kc)
                    wall, own = time.perf_counter() - started, _cpu(me) - own_before
                    names = {thread.native_id: thread.name for thread in threading.enumerate()}
                    print(f"== {kind}: wall {wall / cells * 1e6:.0f} us a cell")
                    print(f"   this process (client, host side): {own / cells * 1e6:7.0f} us a cell")
                    for t in me.threads():
                        spent = t.user_time + t.system_time - threads_before.get(t.id, 0.0)
                        if spent / cells * 1e6 >= 5:
                            print(f"     thread {names.get(t.id, '?'):<28} {spent / cells * 1e6:7.0f} us a cell")
                    for proc in tree:
                        if proc.pid in tree_before:
                            spent = _cpu(proc) - tree_before[proc.pid]
                            try:
                                what = " ".join(proc.cmdline()[-4:])[-70:]
                            except psutil.Error:
                                what = "(ended)"
                            print(f"   process {proc.pid:>7} {spent / cells * 1e6:7.0f} us a cell  {what}")
                finally:
                    shutdown(km, kc)
    print(f"(at {time.strftime('%Y-%m-%d %H:%M:%S')})")


if __name__ == "__main__":
    main()
