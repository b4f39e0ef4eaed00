"""Cost of ivralo's file guards (audit hook, and Landlock under it) against no guards, in the same run.

Three workloads, each timed inside a fresh child process (``sys.executable -B -c``; ``-B`` so no
bytecode is written), with only the workload itself inside the ``time.perf_counter()`` pair:

* **reads**: 100,000 x ``open("existing.txt").close()`` of a file in the workspace (relative name,
  as notebook code writes it);
* **writes**: 1,000 x ``open(f"{i}.txt", "w").write("x")``, all new files (so the history has
  nothing to copy: this is the audit hook's own cost);
* **import**: ``import pandas`` (``import numpy, matplotlib.pyplot`` when pandas is not installed).

Three modes:

* ``none``: the plain child;
* ``guards``: the child after ``install_file_guard(FsPolicy(...), History(...))`` and
  ``guard.starting = False``, as the kernel does (the trust gate is not installed);
* ``guards+landlock``: the same, with Landlock (write trees: the workspace and the temp folder;
  ``/dev/null``) applied first, before the audit hook.

Every child imports the same ivralo modules, whatever its mode, so that ``import pandas`` does not
find, say, ``json`` or ``ctypes`` already imported in the guarded modes only. Each child gets a new,
empty, realpath'd workspace (its cwd); the temp folder is shared by the run.

Why interleaved and in fresh processes: this machine is small (2 cores) and noisy, and a guard is
process-wide and cannot be removed. Repetition r runs every workload in every mode, the mode order
rotating from one repetition to the next, so drift spreads over all modes. Medians are reported, and
ratios guarded / none of the medians. Targets (from the issue): reads <= 1.2x, writes <= 1.5x,
import <= 1.1x.

Run: ``.venv/bin/python bench/guard_overhead.py`` (``--quick`` for a smoke run). A JSON file with
every sample goes to ``bench/results/guard_overhead-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness_api import Context, Metric

from startup_latency import record_header, write_results

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
DEFAULT_RESULTS_DIR = BENCH_DIR / "results"

NONE, GUARDS, LANDLOCK = "none", "guards", "guards+landlock"
MODES = (NONE, GUARDS, LANDLOCK)
GUARDED = (GUARDS, LANDLOCK)

READS, WRITES, IMPORT = "reads", "writes", "import"
WORKLOADS = (READS, WRITES, IMPORT)
TARGETS = {READS: 1.2, WRITES: 1.5, IMPORT: 1.1}  # guarded median / none median

READ_FILE = "existing.txt"
PANDAS_IMPORT = "import pandas"
FALLBACK_IMPORT = "import numpy, matplotlib.pyplot"

# The child: argv[1] is a JSON object (mode, workload, ws, tmp, n, import_stmt). It prints one JSON
# line. Everything before the timed region is the same in every mode except the guards themselves.
CHILD = r"""
import json, os, sys, time
params = json.loads(sys.argv[1])
mode, workload, n = params["mode"], params["workload"], params["n"]
WS, TMP = os.path.realpath(params["ws"]), os.path.realpath(params["tmp"])
os.chdir(WS)
from ivralo_kernel.guards._hooks import install_file_guard
from ivralo_kernel.guards.fs import FsPolicy
from ivralo_kernel.guards.history import History
from ivralo_kernel.guards.landlock import LandlockRules, apply
from ivralo_kernel.protocol import GuardRefusal
out = {"mode": mode, "workload": workload, "n": n, "landlock": None, "guard_active": False}
if mode == "guards+landlock":
    result = apply(LandlockRules(write_trees=(WS, TMP), write_files=("/dev/null",)))
    out["landlock"] = {"applied": result.applied, "abi": result.abi, "reason": result.reason}
if mode != "none":
    guard = install_file_guard(
        FsPolicy(workspace=WS, writable_extra=(TMP, "/dev/null")), History(WS + "/.ivralo/history")
    )
    guard.starting = False
if workload == "reads":
    name = params["read_file"]
    t0 = time.perf_counter()
    for _ in range(n):
        open(name).close()
    t1 = time.perf_counter()
elif workload == "writes":
    t0 = time.perf_counter()
    for i in range(n):
        open(f"{i}.txt", "w").write("x")
    t1 = time.perf_counter()
else:
    code = compile(params["import_stmt"], "<import>", "exec")
    t0 = time.perf_counter()
    exec(code, {})
    t1 = time.perf_counter()
out["seconds"] = t1 - t0
if workload == "writes":
    out["files_written"] = sum(1 for e in os.listdir(".") if e.endswith(".txt") and e[:-4].isdigit())
try:  # is the guard really on? (a write outside the workspace must be refused)
    open("/proc/ivralo-bench-probe/x", "w").close()
except GuardRefusal:
    out["guard_active"] = True
except OSError:
    pass
print(json.dumps(out))
"""


# --------------------------------------------------------------------------- running children


def child_env(tmp: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # As the kernel does: caches go to the private temp folder (matplotlib, in the fallback import).
    env["TMPDIR"] = tmp
    env["XDG_CACHE_HOME"] = os.path.join(tmp, "cache")
    env["MPLCONFIGDIR"] = os.path.join(tmp, "matplotlib")
    return env


def run_child(
    mode: str, workload: str, root: Path, tmp: str, n: int, import_stmt: str, timeout: float
) -> dict[str, Any]:
    ws = os.path.realpath(tempfile.mkdtemp(prefix="ws-", dir=root))
    try:
        if workload == READS:
            Path(ws, READ_FILE).write_text("some content\n", encoding="utf-8")
        params = {
            "mode": mode,
            "workload": workload,
            "ws": ws,
            "tmp": tmp,
            "n": n,
            "import_stmt": import_stmt,
            "read_file": READ_FILE,
        }
        proc = subprocess.run(
            [sys.executable, "-B", "-c", CHILD, json.dumps(params)],
            cwd=ws,
            env=child_env(tmp),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{mode}/{workload} child exited {proc.returncode}:\n{proc.stderr[-3000:]}")
        record: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        if proc.stderr.strip():
            record["stderr"] = proc.stderr[-2000:]
    finally:
        shutil.rmtree(ws, ignore_errors=True)
    problems = []
    if (mode != NONE) != record["guard_active"]:
        problems.append(f"guard_active={record['guard_active']}")
    if mode == LANDLOCK and not (record["landlock"] or {}).get("applied"):
        problems.append(f"landlock not applied: {record['landlock']}")
    if workload == WRITES and record.get("files_written") != n:
        problems.append(f"{record.get('files_written')} files written instead of {n}")
    if problems:
        raise RuntimeError(f"{mode}/{workload}: " + "; ".join(problems))
    return record


def rotated(rep: int) -> tuple[str, ...]:
    k = rep % len(MODES)
    return MODES[k:] + MODES[:k]


def run_all(args: argparse.Namespace, root: Path, import_stmt: str, log: Callable[[str], None]) -> dict[str, Any]:
    tmp = os.path.realpath(tempfile.mkdtemp(prefix="tmp-", dir=root))
    sizes = {READS: args.reads, WRITES: args.writes, IMPORT: 1}
    samples: dict[str, dict[str, list[float]]] = {w: {m: [] for m in MODES} for w in WORKLOADS}
    children: list[dict[str, Any]] = []

    def one(mode: str, workload: str) -> dict[str, Any]:
        return run_child(mode, workload, root, tmp, sizes[workload], import_stmt, args.timeout)

    for i in range(args.warmup):  # page cache, matplotlib's font cache (fallback), CPU frequency
        for workload in WORKLOADS:
            for mode in MODES:
                one(mode, workload)
        log(f"  warm-up round {i + 1}/{args.warmup} done")
    for rep in range(args.reps):
        for workload in WORKLOADS:
            for mode in rotated(rep):
                record = one(mode, workload)
                samples[workload][mode].append(record["seconds"])
                children.append({"rep": rep, **record})
        last = ", ".join(f"{w} " + "/".join(f"{samples[w][m][-1] * 1000:.0f}" for m in MODES) for w in WORKLOADS)
        log(f"  rep {rep + 1}/{args.reps} (ms, {'/'.join(MODES)}): {last}")
    return {"sizes": sizes, "samples": samples, "children": children}


# --------------------------------------------------------------------------- report


def build_report(sizes: dict[str, int], samples: dict[str, dict[str, list[float]]]) -> tuple[dict[str, Any], list[str]]:
    stats: dict[str, dict[str, dict[str, float]]] = {}
    for w in WORKLOADS:
        stats[w] = {}
        for m in MODES:
            values = samples[w][m]
            stats[w][m] = {
                "median_s": statistics.median(values),
                "min_s": min(values),
                "max_s": max(values),
                "n": len(values),
            }
    ratios = {w: {m: stats[w][m]["median_s"] / stats[w][NONE]["median_s"] for m in GUARDED} for w in WORKLOADS}
    min_ratios = {w: {m: stats[w][m]["min_s"] / stats[w][NONE]["min_s"] for m in GUARDED} for w in WORKLOADS}
    targets = {
        f"{w}/{m}": {"target": TARGETS[w], "value": ratios[w][m], "met": bool(ratios[w][m] <= TARGETS[w])}
        for w in WORKLOADS
        for m in GUARDED
    }

    labels = {
        READS: f"reads ({sizes[READS]:,} open+close)",
        WRITES: f"writes ({sizes[WRITES]:,} new files)",
        IMPORT: "import",
    }
    lines: list[str] = []
    header = f"{'median ms':34}{'none':>9}{'guards':>9}{'+landlock':>11}{'ratio g':>9}{'ratio g+l':>11}  target"
    lines.append(header)
    lines.append("-" * (len(header) + 14))
    for w in WORKLOADS:
        med = [stats[w][m]["median_s"] * 1000 for m in MODES]
        verdicts = "/".join("MET" if targets[f"{w}/{m}"]["met"] else "MISSED" for m in GUARDED)
        lines.append(
            f"{labels[w]:34}{med[0]:9.1f}{med[1]:9.1f}{med[2]:11.1f}"
            f"{ratios[w][GUARDS]:9.2f}{ratios[w][LANDLOCK]:11.2f}  <= {TARGETS[w]}x: {verdicts}"
        )
    lines.append("")
    lines.append(
        f"{'per operation, median us':34}{'none':>9}{'guards':>9}{'+landlock':>11}{'added g':>9}{'added g+l':>11}"
    )
    for w in (READS, WRITES):
        per = [stats[w][m]["median_s"] / sizes[w] * 1e6 for m in MODES]
        lines.append(f"  {w:32}{per[0]:9.2f}{per[1]:9.2f}{per[2]:11.2f}{per[1] - per[0]:9.2f}{per[2] - per[0]:11.2f}")
    lines.append("")
    lines.append(f"{'spread (min / max ms)':34}{'none':>17}{'guards':>17}{'+landlock':>17}{'min-ratio g, g+l':>20}")
    for w in WORKLOADS:
        cells = "".join(f"{stats[w][m]['min_s'] * 1000:8.1f} /{stats[w][m]['max_s'] * 1000:7.1f}" for m in MODES)
        lines.append(f"  {w:32}{cells}{min_ratios[w][GUARDS]:12.2f},{min_ratios[w][LANDLOCK]:6.2f}")
    report = {"stats": stats, "ratios_of_medians": ratios, "ratios_of_minimums": min_ratios, "targets": targets}
    return report, lines


def environment_info(import_stmt: str) -> dict[str, Any]:
    from ivralo_kernel.guards.landlock import abi

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", "-C", str(REPO_DIR), *args], capture_output=True, text=True, check=False, timeout=10
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""

    versions = {}
    for module in ("pandas", "numpy", "matplotlib"):
        try:
            versions[module] = __import__(module).__version__ if module in import_stmt else None
        except ImportError:
            versions[module] = None
    return {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "landlock_abi": abi(),
        "imported": import_stmt,
        "versions": {k: v for k, v in versions.items() if v is not None},
        "git_commit": git("rev-parse", "HEAD").strip(),
        "git_modified_files": [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines()],
    }


# --------------------------------------------------------------------------- bench/harness.py


def harness(ctx: Context) -> list[Metric]:
    """Each workload in each guarded mode against no guards, paired by repetition."""
    from harness_api import Metric

    argv = ["--reps", "1", "--warmup", "0", "--reads", "5000", "--writes", "100"] if ctx.smoke else []
    args = parse_args(argv)
    import_stmt = PANDAS_IMPORT if importlib.util.find_spec("pandas") is not None else FALLBACK_IMPORT
    data = run_all(args, Path(os.path.realpath(ctx.root)), import_stmt, ctx.log)
    samples, sizes = data["samples"], data["sizes"]
    labels = {
        READS: f"{sizes[READS]:,} x open+close",
        WRITES: f"{sizes[WRITES]:,} new files",
        IMPORT: f"`{import_stmt}`",
    }
    return [
        Metric(
            "file guards",
            f"{labels[w]}, {m}",
            "ms",
            [v * 1000 for v in samples[w][m]],
            [v * 1000 for v in samples[w][NONE]],
            baseline_label="no guards, same Python",
        )
        for w in WORKLOADS
        for m in GUARDED
    ]


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--reps", type=int, default=7, help="fresh processes per mode and workload (default 7)")
    p.add_argument("--quick", action="store_true", help="smoke mode: 3 repetitions")
    p.add_argument(
        "--warmup", type=int, default=1, help="untimed rounds (every workload, every mode) first (default 1)"
    )
    p.add_argument("--reads", type=int, default=100_000, help="open+close per reads child (default 100000)")
    p.add_argument("--writes", type=int, default=1_000, help="new files per writes child (default 1000)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a child may take (default 300)")
    p.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR, help="where the JSON file goes")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = p.parse_args(argv)
    if args.quick:
        args.reps = 3
    if args.reps < 1 or args.reads < 1 or args.writes < 1 or args.warmup < 0:
        p.error("--reps, --reads and --writes must be at least 1, --warmup at least 0")
    return args


def run(args: argparse.Namespace, root: Path, log: Callable[[str], None]) -> int:
    started = datetime.now(UTC)
    if importlib.util.find_spec("pandas") is not None:
        import_stmt, note = PANDAS_IMPORT, ""
    else:
        import_stmt = FALLBACK_IMPORT
        note = f"pandas is not installed: the import workload is {FALLBACK_IMPORT!r} instead"
        log(f"NOTE: {note}")
    load_before = os.getloadavg()
    t_run = time.monotonic()
    log(
        f"{args.reps} reps x {len(WORKLOADS)} workloads x {len(MODES)} modes, "
        f"a fresh process each (+{args.warmup} warm-up rounds)"
    )
    data = run_all(args, root, import_stmt, log)
    load_after = os.getloadavg()
    report, lines = build_report(data["sizes"], data["samples"])
    env = environment_info(import_stmt)
    print(
        f"guard overhead: {env['cpu_count']} CPUs, Python {env['python']}, Landlock ABI {env['landlock_abi']}, "
        f"{args.reps} fresh processes per cell, import = {import_stmt!r}, "
        f"load avg {load_before[0]:.2f} -> {load_after[0]:.2f}\n"
    )
    if note:
        print(f"NOTE: {note}\n")
    print("\n".join(lines))
    print()
    for name, t in report["targets"].items():
        print(f"{name}: {t['value']:.3f} (target <= {t['target']}x: {'MET' if t['met'] else 'MISSED'})")
    record = {
        **record_header("guard_overhead", started, time.monotonic() - t_run, args, env, (load_before, load_after)),
        "note": note,
        "summary": report,
        "samples": data["samples"],
        "children": data["children"],
    }
    write_results(args.results_dir, "guard_overhead", started, record)
    missed = [name for name, t in report["targets"].items() if not t["met"]]
    return 1 if (args.strict and missed) else 0


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # so that the temp folder is removed


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    root = Path(os.path.realpath(tempfile.mkdtemp(prefix="ivralo-bench-guards-")))
    try:
        return run(args, root, log)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
