"""One harness for every benchmark: ``make bench`` (full, < 15 min) and ``make bench-smoke`` (< 2 min).

Each bench module that defines ``harness(ctx) -> list[Metric]`` (see ``bench/harness_api.py``) is run
in a child process of its own, at the chosen size, one after another. The harness then computes, for
every metric, the median and p95 of ivralo's samples and of the baseline's (plain ipykernel unless
the metric says otherwise), and the ratio ivralo / baseline taken pair by pair (the median of the
per-pair ratios: each pair ran back to back, so the machine's drift cancels). It writes, into
``bench/results/<UTC>-<size>/``:

* ``results.json``: the machine, every sample, every statistic, each module's status;
* ``summary.md``: one Markdown table (and the notes, the skipped modules, the plots);
* PNG plots (matplotlib, Agg): ``latency.png`` (start, round trip, ...), ``overshoot.png`` (deadline
  overshoot), ``memory.png`` (memory per kernel), ``concurrency.png`` (1 to 16 kernels at once);
* ``logs/<module>.log``: what each child printed (progress, and a traceback when it crashed).

``bench/results/latest-<size>`` points to the newest run. ``--update-readme`` (``make bench``) puts
the summary at the top of ``bench/README.md``.

The exit status is 1 when a module crashed, timed out, or returned no samples, or when a result file
is missing; nothing is asserted about speed. A module that is listed but absent (the DataFrame
transport bench, written on another branch) is skipped with a note.

    .venv/bin/python bench/harness.py --size smoke          # what CI runs
    .venv/bin/python bench/harness.py --size full --update-readme
    .venv/bin/python bench/harness.py --size smoke --only startup_latency,concurrency
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness_api import CONCURRENCY, LATENCY, MEMORY, OVERSHOOT, Context, Metric

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
DEFAULT_RESULTS_DIR = BENCH_DIR / "results"
README = BENCH_DIR / "README.md"
README_START, README_END = "<!-- bench:latest-full-run -->", "<!-- /bench:latest-full-run -->"

# The order of the table. Modules not listed here that define ``harness`` are run after these.
MODULES: tuple[tuple[str, str], ...] = (
    ("startup_latency", "start to ready, 1+1 round trip"),
    ("kernel_cells", "100 cells, 1 MB of output, interrupt"),
    ("deadline_precision", "deadline overshoot"),
    ("guard_overhead", "file guards"),
    ("network_guard", "network guard"),
    ("concurrency", "1, 2, 4, 8, 16 kernels at once"),
    ("idle_rss", "memory per kernel"),
    ("broker", "credential broker"),
    ("sandbox_cost", "egress proxy"),
    ("dataframe_transfer", "DataFrame transport"),
    ("effects_cost", "the effects report's cost"),
    ("warm_pool", "warm pool"),
    ("gateway", "through a Kernel Gateway vs local"),
    ("warm_notebook", "JupyterLab's new notebook, warm spare"),
    ("mcp_overhead", "run_python over MCP stdio vs Session.run"),
    ("restart_cost", "restart through KernelManager"),
)
# Per child: a smoke module takes seconds; a hung one must not hold CI.
CHILD_TIMEOUT_S = {"smoke": 150.0, "full": 420.0}
PLOTS = {LATENCY: "latency.png", OVERSHOOT: "overshoot.png", MEMORY: "memory.png", CONCURRENCY: "concurrency.png"}


# --------------------------------------------------------------------------- statistics


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def statistics_of(metric: Metric) -> dict[str, Any]:
    stats: dict[str, Any] = {
        "n": len(metric.ivralo),
        "ivralo_median": percentile(metric.ivralo, 50),
        "ivralo_p95": percentile(metric.ivralo, 95),
    }
    if metric.baseline is not None:
        pairs = [(a, b) for a, b in zip(metric.ivralo, metric.baseline, strict=False) if b]
        ratios = [a / b for a, b in pairs]
        stats |= {
            "baseline_n": len(metric.baseline),
            "baseline_median": percentile(metric.baseline, 50),
            "baseline_p95": percentile(metric.baseline, 95),
            "pairs": len(pairs),
            "ratio_median_of_pairs": percentile(ratios, 50),
            "ratio_p95_of_pairs": percentile(ratios, 95),
        }
    return stats


def fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:.0f}"
    if magnitude >= 10:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


# --------------------------------------------------------------------------- the machine


def machine_info() -> dict[str, Any]:
    from importlib import metadata

    def first(path: str, key: str) -> str:
        try:
            for line in Path(path).read_text().splitlines():
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return "unknown"

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "-"

    def git(*args: str) -> str:
        try:
            out = subprocess.run(["git", "-C", str(REPO_DIR), *args], capture_output=True, text=True, timeout=10)
            return out.stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    mem_kib = first("/proc/meminfo", "MemTotal").split()[0]
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": first("/proc/cpuinfo", "model name"),
        "memory_gib": round(int(mem_kib) / (1 << 20), 1) if mem_kib.isdigit() else None,
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "ipykernel": version("ipykernel"),
        "jupyter_client": version("jupyter_client"),
        "ivralo_kernel": version("ivralo-kernel"),
        "git_commit": git("rev-parse", "--short", "HEAD"),
        "git_modified": bool(git("status", "--porcelain", "--untracked-files=no")),
        "loadavg_before": os.getloadavg(),
    }


def machine_line(m: dict[str, Any]) -> str:
    return (
        f"{m['nproc']} cores (`nproc`), {m['cpu_model']}, {m['memory_gib']} GiB, Linux {m['kernel']}, "
        f"Python {m['python']}, ipykernel {m['ipykernel']}, jupyter_client {m['jupyter_client']}; "
        f"load average {m['loadavg_before'][0]:.2f} before, {m['loadavg_after'][0]:.2f} after; "
        f"commit {m['git_commit']}{' (modified)' if m['git_modified'] else ''}"
    )


# --------------------------------------------------------------------------- the modules


def discover() -> list[tuple[str, str]]:
    """The listed modules, then any other ``bench/*.py`` that defines ``harness`` (found by reading it:
    importing would run its set-up)."""
    listed = {name for name, _ in MODULES}
    extra = []
    for path in sorted(BENCH_DIR.glob("*.py")):
        if path.stem in listed or path.stem.startswith("harness"):
            continue
        if re.search(r"^def harness\(", path.read_text(encoding="utf-8"), re.MULTILINE):
            extra.append((path.stem, ""))
    return [*MODULES, *extra]


def defines_harness(name: str) -> bool:
    path = BENCH_DIR / f"{name}.py"
    return path.is_file() and re.search(r"^def harness\(", path.read_text(encoding="utf-8"), re.MULTILINE) is not None


def run_child(name: str, size: str, out_dir: Path) -> dict[str, Any]:
    """Run one module in a child process; its status, duration, metrics and notes."""
    log_path = out_dir / "logs" / f"{name}.log"
    data_path = out_dir / "logs" / f"{name}.json"
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", name, "--size", size, "--out", str(data_path)]
    t0 = time.monotonic()
    status = "ok"
    with log_path.open("wb") as log:
        # A session of its own, so that a timed-out child's whole group can be ended.
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_DIR, start_new_session=True)
        try:
            code = proc.wait(timeout=CHILD_TIMEOUT_S[size])
            if code != 0:
                status = f"crashed (exit {code})"
        except subprocess.TimeoutExpired:
            status = f"timed out after {CHILD_TIMEOUT_S[size]:.0f} s"
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    result: dict[str, Any] = {"status": status, "duration_s": round(time.monotonic() - t0, 1), "log": str(log_path)}
    if data_path.is_file():
        data = json.loads(data_path.read_text(encoding="utf-8"))
        result["metrics"] = data["metrics"]
        result["notes"] = data["notes"]
    else:
        result["metrics"], result["notes"] = [], []
        if status == "ok":
            result["status"] = "crashed (wrote no results)"
    if status == "ok" and not any(m["ivralo"] for m in result["metrics"]):
        result["status"] = "crashed (no samples)"
    return result


def child_main(name: str, size: str, out: Path) -> int:
    """In the child: isolate Jupyter's folders, run the module's ``harness``, write its metrics."""
    from startup_latency import KERNEL_LOG, isolate_jupyter, run_bench

    def run(root: Path) -> int:
        isolate_jupyter(root)
        # As the kernels do: caches (matplotlib's) go to the private folder, not the user's.
        os.environ.setdefault("MPLCONFIGDIR", str(root / "matplotlib"))
        module = importlib.import_module(name)
        with (root / KERNEL_LOG).open("wb") as kernel_log:
            ctx = Context(size=size, root=root, kernel_log=kernel_log)
            metrics: list[Metric] = module.harness(ctx)
        data = {"metrics": [m.to_json() for m in metrics], "notes": ctx.notes}
        out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        for m in metrics:
            print(f"  {m.benchmark} / {m.metric}: {len(m.ivralo)} samples", file=sys.stderr)
        return 0

    return run_bench(f"ivralo-harness-{name}-", run)


# --------------------------------------------------------------------------- report


def table_rows(modules: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for result in modules.values():
        for data in result.get("metrics", []):
            metric = Metric.from_json(data)
            rows.append({"metric": metric, "stats": statistics_of(metric)})
    return rows


def markdown_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| benchmark | metric | unit | ivralo median | p95 | baseline median | p95 | ratio (pairs) | n | baseline |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        m: Metric = row["metric"]
        s = row["stats"]
        has_base = m.baseline is not None
        ratio = f"{s['ratio_median_of_pairs']:.2f}" if has_base else "-"
        lines.append(
            f"| {m.benchmark} | {m.metric} | {m.unit} | {fmt(s['ivralo_median'])} | {fmt(s['ivralo_p95'])} "
            f"| {fmt(s.get('baseline_median'))} | {fmt(s.get('baseline_p95'))} | {ratio} | {s['n']} "
            f"| {m.baseline_label if has_base else 'none'} |"
        )
    return lines


def summary_markdown(record: dict[str, Any], rows: list[dict[str, Any]], plots: list[str]) -> str:
    lines = [
        f"Run {record['started_at']} ({record['size']} size, {record['duration_s']:.0f} s in all) on: "
        f"{machine_line(record['machine'])}.",
        "",
        "Medians and p95 over the samples; ratio = ivralo / baseline, the median of the per-pair ratios "
        "(each pair ran back to back, so the machine's drift cancels). Below 1.0: ivralo is faster or smaller.",
        "",
        *markdown_table(rows),
        "",
    ]
    notes = [(name, note) for name, r in record["modules"].items() for note in r.get("notes", [])]
    notes += [(r["metric"].benchmark, f"{r['metric'].metric}: {r['metric'].note}") for r in rows if r["metric"].note]
    if notes:
        lines += ["Notes:", ""] + [f"- {name}: {note}" for name, note in notes] + [""]
    status = [f"- {name}: {r['status']}, {r['duration_s']:.0f} s" for name, r in record["modules"].items()]
    lines += ["Modules:", "", *status, ""]
    if plots:
        lines += ["Plots: " + ", ".join(f"[{p}]({p})" for p in plots), ""]
    return "\n".join(lines)


def draw_plots(rows: list[dict[str, Any]], out_dir: Path) -> list[str]:
    """One PNG per plot family that has metrics; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families: dict[str, list[Metric]] = {}
    for row in rows:
        m: Metric = row["metric"]
        if m.plot in PLOTS and m.ivralo:
            families.setdefault(m.plot, []).append(m)
    written = []
    for family, metrics in families.items():
        if family == CONCURRENCY:
            fig = _plot_concurrency(plt, metrics)
        elif family == MEMORY:
            fig = _plot_memory(plt, metrics)
        else:
            fig = _plot_distributions(plt, metrics, family)
        fig.tight_layout()
        fig.savefig(out_dir / PLOTS[family], dpi=100)
        plt.close(fig)
        written.append(PLOTS[family])
    return written


def _plot_distributions(plt: Any, metrics: list[Metric], family: str) -> Any:
    """A box plot per metric, ivralo beside its baseline, each with its own scale."""
    cols = min(3, len(metrics))
    rows = math.ceil(len(metrics) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.6 * rows), squeeze=False)
    for ax, m in zip(axes.flat, metrics, strict=False):
        data, labels = [m.ivralo], ["ivralo"]
        if m.baseline:
            data.append(m.baseline)
            labels.append(m.baseline_label)
        ax.boxplot(data, whis=(5, 95), showfliers=True)
        ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=8)
        ax.set_title(f"{m.benchmark}: {m.metric}", fontsize=9)
        ax.set_ylabel(m.unit)
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(metrics) :]:
        ax.set_visible(False)
    title = "deadline overshoot (elapsed - deadline)" if family == OVERSHOOT else "latency distributions"
    fig.suptitle(f"{title}; whiskers 5th-95th percentile")
    return fig


def _plot_memory(plt: Any, metrics: list[Metric]) -> Any:
    fig, ax = plt.subplots(figsize=(2.2 * len(metrics) + 3, 4))
    width = 0.38
    for i, m in enumerate(metrics):
        for offset, values, label, color in (
            (-width / 2, m.ivralo, "ivralo", "tab:blue"),
            (width / 2, m.baseline or [], m.baseline_label, "tab:gray"),
        ):
            if not values:
                continue
            med, p95 = percentile(values, 50), percentile(values, 95)
            ax.bar(
                i + offset, med, width, yerr=[[0], [p95 - med]], color=color, capsize=4, label=label if i == 0 else None
            )
    ax.set_xticks(range(len(metrics)), [m.metric for m in metrics], fontsize=8)
    ax.set_ylabel(metrics[0].unit)
    ax.set_title("idle memory per kernel: median, whisker to p95")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    return fig


def _plot_concurrency(plt: Any, metrics: list[Metric]) -> Any:
    fig, ax = plt.subplots(figsize=(6, 4))
    ordered = sorted(metrics, key=lambda m: m.level or 0)
    levels = [m.level or 0 for m in ordered]
    for attr, label, color in (("ivralo", "ivralo", "tab:blue"), ("baseline", "plain ipykernel", "tab:gray")):
        series = [getattr(m, attr) or [] for m in ordered]
        if not all(series):
            continue
        med = [percentile(s, 50) for s in series]
        p95 = [percentile(s, 95) for s in series]
        ax.errorbar(
            levels,
            med,
            yerr=[[0] * len(med), [b - a for a, b in zip(med, p95, strict=True)]],
            marker="o",
            capsize=4,
            label=label,
            color=color,
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(n) for n in levels])
    ax.set_xlabel("kernels started at once")
    ax.set_ylabel(ordered[0].unit)
    ax.set_title("time until all are ready: median, whisker to p95")
    ax.legend()
    ax.grid(alpha=0.3)
    return fig


def update_readme(summary: str) -> None:
    text = README.read_text(encoding="utf-8")
    block = f"{README_START}\n{summary.rstrip()}\n{README_END}"
    if README_START in text and README_END in text:
        head, rest = text.split(README_START, 1)
        text = head + block + rest.split(README_END, 1)[1]
    else:
        title, _, body = text.partition("\n")
        text = f"{title}\n\n## Latest full run\n\n{block}\n{body}"
    README.write_text(text, encoding="utf-8")


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", choices=("smoke", "full"), default="smoke")
    p.add_argument("--only", default="", help="comma-separated module names (default: all)")
    p.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR)
    p.add_argument("--update-readme", action="store_true", help="put the summary at the top of bench/README.md")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args.child, args.size, args.out)
    started = datetime.now(UTC)
    t0 = time.monotonic()
    out_dir = args.results_dir / f"{started.strftime('%Y%m%dT%H%M%SZ')}-{args.size}"
    (out_dir / "logs").mkdir(parents=True)
    machine = machine_info()
    only = {n for n in args.only.split(",") if n}
    modules: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    for name, what in discover():
        if only and name not in only:
            continue
        if not (BENCH_DIR / f"{name}.py").is_file():
            skipped[name] = f"{what}: bench/{name}.py is not there yet; skipped"
            print(f"{name:20} skipped: bench/{name}.py is not there", flush=True)
            continue
        if not defines_harness(name):
            skipped[name] = f"{what}: bench/{name}.py defines no harness(ctx); skipped"
            print(f"{name:20} skipped: no harness(ctx)", flush=True)
            continue
        print(f"{name:20} running ({what}) ...", end=" ", flush=True)
        result = run_child(name, args.size, out_dir)
        modules[name] = result
        print(f"{result['status']}, {result['duration_s']:.0f} s", flush=True)
        if result["status"] != "ok":
            tail = Path(result["log"]).read_text(errors="replace").splitlines()[-30:]
            print("\n".join(f"    | {line}" for line in tail), flush=True)
    machine["loadavg_after"] = os.getloadavg()
    rows = table_rows(modules)
    record: dict[str, Any] = {
        "started_at": started.strftime("%Y-%m-%d %H:%M UTC"),
        "size": args.size,
        "duration_s": time.monotonic() - t0,
        "machine": machine,
        "modules": modules,
        "skipped": skipped,
        "rows": [{**r["metric"].to_json(), "stats": r["stats"]} for r in rows],
    }
    plots = draw_plots(rows, out_dir)
    summary = summary_markdown(record, rows, plots)
    if skipped:
        summary += "\nSkipped:\n\n" + "\n".join(f"- {name}: {note}" for name, note in skipped.items()) + "\n"
    (out_dir / "summary.md").write_text(summary, encoding="utf-8")
    (out_dir / "results.json").write_text(json.dumps(record, indent=1, default=str) + "\n", encoding="utf-8")
    latest = args.results_dir / f"latest-{args.size}"
    latest.unlink(missing_ok=True)
    latest.symlink_to(out_dir.name)
    print()
    print(summary)
    print(f"results: {out_dir}")
    problems = [f"{name}: {r['status']}" for name, r in modules.items() if r["status"] != "ok"]
    expected_plots = {PLOTS[r["metric"].plot] for r in rows if r["metric"].plot in PLOTS}
    problems += [f"missing {f}" for f in ["results.json", "summary.md", *expected_plots] if not (out_dir / f).is_file()]
    if problems:
        print("FAILED: " + "; ".join(problems), file=sys.stderr)
        return 1
    if args.update_readme:  # only a run where every module worked
        # The plots stay in bench/results (git-ignored): named, not linked.
        plot_line = f"Plots: {', '.join(plots)} in bench/results/latest-{args.size}/ (not committed)."
        update_readme(re.sub(r"^Plots: .*$", plot_line, summary, flags=re.MULTILINE))
        print(f"updated {README.relative_to(REPO_DIR)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
