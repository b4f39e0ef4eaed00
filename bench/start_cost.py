"""What a kernel's start costs, ivralo (sandboxed, as installed) against plain ipykernel, same run.

Two parts, both through ``jupyter_client.KernelManager`` and the installed kernelspecs (the ivralo
one brings its provisioner, which puts the kernel in the OS sandbox when bwrap works here):

1. **one at a time**, interleaved (plain, ivralo, then ivralo, plain, ...): start to ready (the
   first ``kernel_info_reply`` that ``wait_for_ready()`` accepts) and the **start CPU**: user +
   system time of the kernel's whole process tree at that moment (bwrap, supervisor, kernel, and
   whatever they started and reaped), read with psutil. The host's own CPU for the start (this
   process, ``time.process_time()``, plus children it reaped) is shown apart: the same client runs
   for both kinds, so its difference is the provisioner's work.
2. **K at once** (``--concurrent K``, default 16; 0 skips it): K kernels of one kind started from K
   threads together, the time until the last is ready, and the USS of all their trees summed once
   they are. Rounds alternate the kind.

Run: ``.venv/bin/python bench/start_cost.py [--starts N] [--concurrent K] [--rounds R]``.
Every sample goes to ``bench/results/start_cost-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup_latency import (
    DEFAULT_RESULTS_DIR,
    IVRALO,
    KERNEL_LOG,
    PLAIN,
    Bench,
    environment_info,
    isolate_jupyter,
    log_to_stderr,
    record_header,
    run_bench,
    shutdown,
    write_results,
)

MiB = 1024 * 1024


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def tree_cpu_ms(pid: int) -> float:
    """User + system time of the tree, with what each process reaped (its children_* times)."""
    total = 0.0
    for proc in tree(pid):
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total * 1000


def tree_uss(pid: int) -> int:
    total = 0
    for proc in tree(pid):
        try:
            total += proc.memory_full_info().uss
        except psutil.Error:
            continue
    return total


def host_cpu_s() -> float:
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def launched_pid(km: Any) -> int:
    return int(km.provisioner.process.pid)


def one_start(bench: Bench, kind: str) -> dict[str, float]:
    km = bench.new_manager(kind)
    kc = None
    host0 = host_cpu_s()
    try:
        kc, times = bench.start(km)
        cpu = tree_cpu_ms(launched_pid(km))
        host = (host_cpu_s() - host0) * 1000
        return {"ready_ms": times["ready_ms"], "tree_cpu_ms": cpu, "host_cpu_ms": host}
    finally:
        shutdown(km, kc)


def many_at_once(bench: Bench, kind: str, count: int) -> dict[str, float]:
    managers = [bench.new_manager(kind) for _ in range(count)]
    clients: list[Any] = [None] * count
    errors: list[BaseException] = []
    barrier = threading.Barrier(count + 1)
    ready = threading.Barrier(count + 1)
    measured = threading.Event()

    def start(i: int) -> None:
        barrier.wait()
        try:
            clients[i], _ = bench.start(managers[i])
        except BaseException as exc:
            errors.append(exc)
        ready.wait()
        # The thread lives until the trees are measured: bwrap's --die-with-parent (a parent-death
        # signal) fires when the thread that started it exits.
        measured.wait()

    threads = [threading.Thread(target=start, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    try:
        barrier.wait()
        t0 = time.perf_counter()
        ready.wait()
        all_ready = (time.perf_counter() - t0) * 1000
        if errors:  # say which kind: plain kernels started at once can race for TCP ports
            raise RuntimeError(f"{len(errors)} of {count} {kind} kernels started at once failed") from errors[0]
        uss = sum(tree_uss(launched_pid(km)) for km in managers)
        cpu = sum(tree_cpu_ms(launched_pid(km)) for km in managers)
    finally:
        measured.set()
        for t in threads:
            t.join()
        for km, kc in zip(managers, clients, strict=True):
            shutdown(km, kc)
    return {"all_ready_ms": all_ready, "uss_mib": uss / MiB, "tree_cpu_ms": cpu}


def ratio_line(name: str, samples: dict[str, list[dict[str, float]]], key: str, unit: str) -> str:
    plain = statistics.median(s[key] for s in samples[PLAIN])
    ivralo = statistics.median(s[key] for s in samples[IVRALO])
    return f"{name:<28} {plain:9.1f} {ivralo:9.1f} {unit:<4} {ivralo / plain:6.2f}x"


def run(args: argparse.Namespace, root: Path, log: Callable[[str], None]) -> int:
    started = datetime.now(UTC)
    folders = isolate_jupyter(root)
    workspace = root / "workspace"
    workspace.mkdir()
    load_before = os.getloadavg()
    t_run = time.monotonic()
    starts: dict[str, list[dict[str, float]]] = {PLAIN: [], IVRALO: []}
    crowds: dict[str, list[dict[str, float]]] = {PLAIN: [], IVRALO: []}
    with (root / KERNEL_LOG).open("wb") as kernel_log:
        bench = Bench(workspace, Path(folders["JUPYTER_RUNTIME_DIR"]), kernel_log, args.timeout)
        for kind in (PLAIN, IVRALO):  # warm-up: page cache, the kernelspec's first read
            one_start(bench, kind)
        for i in range(args.starts):
            for kind in (PLAIN, IVRALO) if i % 2 == 0 else (IVRALO, PLAIN):
                starts[kind].append(one_start(bench, kind))
            log(f"start {i + 1}/{args.starts}")
        for i in range(args.rounds if args.concurrent else 0):
            for kind in (PLAIN, IVRALO) if i % 2 == 0 else (IVRALO, PLAIN):
                crowds[kind].append(many_at_once(bench, kind, args.concurrent))
                log(f"{args.concurrent} at once, {kind}: {crowds[kind][-1]['all_ready_ms']:.0f} ms")
    load_after = os.getloadavg()
    env = environment_info()
    print(f"start cost, medians: load avg {load_before[0]:.2f} -> {load_after[0]:.2f}, {env['cpu_count']} CPUs\n")
    print(f"{'':<28} {'plain':>9} {'ivralo':>9} {'':<4} {'ratio':>7}")
    print(ratio_line("start to ready", starts, "ready_ms", "ms"))
    print(ratio_line("start CPU (kernel tree)", starts, "tree_cpu_ms", "ms"))
    print(ratio_line("host CPU for the start", starts, "host_cpu_ms", "ms"))
    if crowds[PLAIN]:
        print(ratio_line(f"{args.concurrent} at once: all ready", crowds, "all_ready_ms", "ms"))
        print(ratio_line(f"{args.concurrent} at once: USS", crowds, "uss_mib", "MiB"))
        print(ratio_line(f"{args.concurrent} at once: CPU", crowds, "tree_cpu_ms", "ms"))
    record = {
        **record_header("start_cost", started, time.monotonic() - t_run, args, env, (load_before, load_after)),
        "samples": {"starts": starts, "concurrent": crowds},
    }
    write_results(args.results_dir, "start_cost", started, record)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--starts", type=int, default=10, help="interleaved starts per kind (default 10)")
    p.add_argument("--concurrent", type=int, default=16, help="kernels started at once (default 16; 0: skip)")
    p.add_argument("--rounds", type=int, default=2, help="rounds of K at once per kind (default 2)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds a kernel gets to become ready")
    p.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR)
    args = p.parse_args(argv)
    return run_bench("ivralo-start-cost-", lambda root: run(args, root, log_to_stderr))


if __name__ == "__main__":
    sys.exit(main())
