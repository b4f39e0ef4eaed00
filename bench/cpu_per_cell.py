"""Where a ``1+1`` cell's CPU goes, by process and by thread: plain ipykernel and the ivralo kernel
(defaults: sandbox, relay, effects report, deadline), each driven by the same client in this
process for ``--cells`` round trips (reply and idle, as ``startup_latency``'s row).

For each kind it prints the wall time per cell, then the CPU per cell of this process (the client,
and for ivralo the provisioner's threads: the watchdog, the channel relay's, the history recorder,
libzmq's I/O threads, shown as ``?``), and of each process of the kernel's tree (for ivralo: bwrap,
the supervisor, the kernel). CPU is read from /proc (``psutil``), so it counts what each part
costs the machine, not only what lands on the reply's way; on 2 cores the two are close.

``--syscalls``: for ivralo, ``strace -c`` follows the watchdog's and the shell relay's threads
during the timed cells too (strace slows what it follows: read the counts, not that run's times),
and their system calls per cell are printed: how often each thread wakes (``poll``) and what it
does then.

Diagnostic only: ``make bench`` does not run it.
Run: ``.venv/bin/python bench/cpu_per_cell.py [--cells N] [--syscalls]`` (~30 s at the default 500).
"""

from __future__ import annotations

import argparse
import signal
import subprocess
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
    parser.add_argument("--syscalls", action="store_true", help="strace -c the watchdog's and shell relay's threads")
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
                    tracers = _follow(root) if args.syscalls and kind == "ivralo" else []
                    own_before, started = _cpu(me), time.perf_counter()
                    for _ in range(cells):
                        bench.roundtrip(kc)
                    wall, own = time.perf_counter() - started, _cpu(me) - own_before
                    _stop(tracers)
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
                    _report(tracers, cells)  # strace slowed the threads it followed: their CPU above too
                finally:
                    shutdown(km, kc)
    print(f"(at {time.strftime('%Y-%m-%d %H:%M:%S')})")


Tracer = tuple[str, "subprocess.Popen[bytes]", Path]


def _follow(root: Path) -> list[Tracer]:
    """``strace -c`` attached to the watchdog's and the shell relay's threads (by thread id)."""
    wanted = {
        t.name: t.native_id
        for t in threading.enumerate()
        if t.name.startswith(("ivralo-watchdog", "ivralo-relay-shell"))
    }
    tracers = []
    for name, tid in sorted(wanted.items()):
        out = root / f"strace-{tid}.txt"
        proc = subprocess.Popen(["strace", "-c", "-o", str(out), "-p", str(tid)], stderr=subprocess.PIPE)
        assert proc.stderr is not None
        said = proc.stderr.readline().decode(errors="replace")  # "strace: Process N attached": it follows now
        if "attached" not in said:
            proc.kill()
            proc.wait()
            raise SystemExit(f"strace could not follow thread {name}: {said.strip()} (root, or ptrace allowed)")
        tracers.append((name, proc, out))
    return tracers


def _stop(tracers: list[Tracer]) -> None:
    for _, proc, _ in tracers:
        proc.send_signal(signal.SIGINT)  # strace writes its summary and detaches
        proc.communicate(timeout=30)


def _report(tracers: list[Tracer], cells: int) -> None:
    for name, _, out in tracers:
        rows = [line.split() for line in out.read_text().splitlines()[2:] if line and not line.startswith("-")]
        calls = {row[-1]: int(row[3]) for row in rows if len(row) >= 5 and row[-1] != "total"}
        shown = ", ".join(f"{calls[c] / cells:.1f} {c}" for c in sorted(calls, key=calls.get, reverse=True)[:6])
        print(f"   syscalls a cell, thread {name}: {shown}")


if __name__ == "__main__":
    main()
