"""How precisely the ivralo worker enforces a per-execution deadline, seen from the agent API.

For each case below, a cell that never finishes by itself is run through
``Session(config=WorkerConfig(deadline_ms=D, interrupt_grace_ms=G)).run(code)``, and the time from
the call to its return is measured (``time.monotonic()``). Defaults: D = 1000 ms, G = 500 ms,
50 trials per case.

Cases and the outcome each should have:

* **python loop** (``while True: pass``), **time.sleep** and **await asyncio.sleep**: *interrupted*
  at the deadline; the error is ``INTERRUPTED_TEXT`` and the namespace survives, so one session
  serves every trial of the case.
* **native code ignoring SIGINT** (``time.sleep(0.2)`` then ``sum(range(10**11))``) and **native from
  the first line** (``sum(range(10**11))``): the interrupt cannot land, so the worker's tree is
  *killed* after the grace (``REPL worker terminated (timeout: ...``). The session starts a fresh
  worker on the next call by itself.

Before every timed call, an untimed ``pass`` makes sure the worker is started, warm and idle (for the
killed cases this is where the fresh worker's start-up goes). Trials are interleaved across cases
(trial 1 of every case, then trial 2, ...; the order rotates) so machine drift is shared by all cases.

Reported per case: outcome counts (interrupted / killed / other, with the first unexpected message),
overshoot past D (elapsed - D) as median, p95, max; for the killed cases also overshoot past D + G;
and the promised bound: every call answered within D + G + 250 ms (max elapsed and violations).
For killed trials, who ended the tree is noted: the supervisor's backstop (it announces itself on
the worker's stderr, which this script captures) or else the host-side watchdog (its ``loss`` is
set); and, from polling both pids every 10 ms during the call, when the kernel and the supervisor
were gone, so that the time the session then took to return shows.

Run: ``.venv/bin/python bench/deadline_precision.py`` (``--quick`` for 5 trials per case). A JSON file
with every sample goes to ``bench/results/deadline_precision-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from startup_latency import (
    DEFAULT_RESULTS_DIR,
    KERNEL_LOG,
    KNOWN_KERNEL_NOISE,
    environment_info,
    isolate_jupyter,
    percentile,
    reap_children,
    record_header,
    run_bench,
    write_results,
)

if TYPE_CHECKING:
    from harness_api import Context, Metric

INTERRUPTED, KILLED, OTHER = "interrupted", "killed", "other"
OUTCOMES = (INTERRUPTED, KILLED, OTHER)
BOUND_SLACK_MS = 250  # the promise: answered within deadline + grace + 250 ms
MESSAGE_CHARS = 600  # how much of each error message goes into the JSON
# What the supervisor prints to stderr when its backstop ends the tree (ivralo_kernel/supervisor/run.py).
BACKSTOP_ANNOUNCEMENT = "ivralo supervisor: the running cell outlived its deadline and grace"
EXIT_POLL_S = 0.01  # killed cases: how often the processes are checked during the timed call


@dataclass(frozen=True)
class Case:
    key: str
    label: str
    code: str
    expected: str


CASES = (
    Case("python_loop", "python loop", "while True: pass", INTERRUPTED),
    Case("time_sleep", "time.sleep", "import time\ntime.sleep(60)", INTERRUPTED),
    Case("asyncio_sleep", "await asyncio.sleep", "import asyncio\nawait asyncio.sleep(60)", INTERRUPTED),
    Case(
        "native_after_sleep", "native code ignoring SIGINT", "import time\ntime.sleep(0.2)\nsum(range(10**11))", KILLED
    ),
    Case("native_first_line", "native from the first line", "sum(range(10**11))", KILLED),
)


def classify(result: object, deadline_ms: int) -> tuple[str, str]:
    """The outcome of one timed call, and its message."""
    from ivralo_kernel.protocol import names

    if not isinstance(result, dict):
        return OTHER, f"returned without an error: {result!r}"
    error = str(result.get("error", ""))
    if error == names.INTERRUPTED_TEXT.format(deadline_ms=deadline_ms):
        return INTERRUPTED, error
    if error.startswith(f"REPL worker terminated (timeout: execution exceeded deadline_ms={deadline_ms}"):
        return KILLED, error
    return OTHER, error or repr(result)


def process_gone(pid: int | None) -> bool | None:
    """Whether a process no longer runs (a zombie counts as gone); None if the pid was unknown."""
    import psutil

    if pid is None:
        return None
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def watch_exits(pids: dict[str, int | None], t0: float, ended: dict[str, float]) -> None:
    """Fill ``ended[name]`` with the ms after ``t0`` at which each process was first seen gone."""
    while len(ended) < len(pids):
        for name, pid in pids.items():
            if name not in ended and process_gone(pid):
                ended[name] = (time.monotonic() - t0) * 1000
        await asyncio.sleep(EXIT_POLL_S)


class Bench:
    def __init__(self, root: Path, deadline_ms: int, grace_ms: int, captured: Path, log: Callable[[str], None]) -> None:
        from ivralo_kernel.host import Session, WorkerConfig

        self.deadline_ms, self.grace_ms, self.log = deadline_ms, grace_ms, log
        self.captured = captured  # the workers' stderr: the supervisor announces its backstop kill there
        config = WorkerConfig(deadline_ms=deadline_ms, interrupt_grace_ms=grace_ms)
        self.sessions: dict[str, Session] = {}
        for case in CASES:
            workspace = root / "workspaces" / case.key
            workspace.mkdir(parents=True)
            self.sessions[case.key] = Session(workspace=workspace, config=config)
        self.worker_starts: dict[str, int] = {case.key: 0 for case in CASES}

    async def close(self) -> None:
        for session in self.sessions.values():
            await session.close()

    async def warm(self, case: Case) -> None:
        """Untimed ``pass``: the worker is started (a fresh one after a kill), warm and idle."""
        session = self.sessions[case.key]
        before = session.pid
        result = await session.run("pass")
        if result != "":
            raise RuntimeError(f"{case.label}: the untimed 'pass' failed: {result!r}")
        if session.pid != before:
            self.worker_starts[case.key] += 1

    async def trial(self, case: Case) -> dict[str, Any]:
        await self.warm(case)
        session = self.sessions[case.key]
        kernel_pid, supervisor_pid, watchdog = session.pid, session.supervisor_pid, session.watchdog
        ended: dict[str, float] = {}
        stderr_offset = self.captured.stat().st_size if self.captured.is_file() else 0
        t0 = time.monotonic()
        watcher = None
        if case.expected == KILLED:
            pids = {"kernel": kernel_pid, "supervisor": supervisor_pid}
            watcher = asyncio.create_task(watch_exits(pids, t0, ended))
        try:
            result = await session.run(case.code)
            elapsed_ms = (time.monotonic() - t0) * 1000
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
        outcome, message = classify(result, self.deadline_ms)
        record: dict[str, Any] = {
            "outcome": outcome,
            "elapsed_ms": elapsed_ms,
            "overshoot_ms": elapsed_ms - self.deadline_ms,
            "overshoot_past_grace_ms": elapsed_ms - self.deadline_ms - self.grace_ms,
            "within_bound": elapsed_ms <= self.deadline_ms + self.grace_ms + BOUND_SLACK_MS,
            "kernel_pid": kernel_pid,
            "message": message[:MESSAGE_CHARS],
        }
        if outcome == KILLED:
            with self.captured.open("rb") as f:
                f.seek(stderr_offset)
                backstop = BACKSTOP_ANNOUNCEMENT in f.read().decode(errors="replace")
            watchdog_loss = watchdog is not None and watchdog.loss is not None
            record["backstop_announced"], record["watchdog_loss_set"] = backstop, watchdog_loss
            # The supervisor prints its announcement before it kills, so it wins when both acted.
            record["killed_by"] = "supervisor backstop" if backstop else "host watchdog" if watchdog_loss else "unknown"
            record["kernel_gone_at_return"] = process_gone(kernel_pid)
            record["supervisor_gone_at_return"] = process_gone(supervisor_pid)
            # When each process was seen gone (ms after the call; EXIT_POLL_S resolution), and how long
            # the session took from the kernel's end to returning (noticing the loss, cleaning up).
            record["kernel_ended_ms"] = ended.get("kernel")
            record["supervisor_ended_ms"] = ended.get("supervisor")
            if "supervisor" in ended:
                record["return_after_supervisor_end_ms"] = elapsed_ms - ended["supervisor"]
        elif session.pid != kernel_pid:
            record["worker_replaced"] = True  # e.g. an "other" outcome that lost the worker
        return record


async def run_trials(bench: Bench, trials: int, log: Callable[[str], None]) -> dict[str, list[dict[str, Any]]]:
    records: dict[str, list[dict[str, Any]]] = {case.key: [] for case in CASES}
    for i in range(trials):
        shift = i % len(CASES)
        for case in CASES[shift:] + CASES[:shift]:
            record = await bench.trial(case)
            records[case.key].append(record)
            flag = "" if record["outcome"] == case.expected else f"  UNEXPECTED: {record['message'][:160]}"
            bound = "" if record["within_bound"] else "  OVER BOUND"
            log(
                f"  trial {i + 1}/{trials} {case.label}: {record['outcome']} {record['elapsed_ms']:.0f} ms{bound}{flag}"
            )
    return records


# --------------------------------------------------------------------------- report


def stats(values: list[float]) -> dict[str, float | int]:
    return {
        "n": len(values),
        "median": percentile(values, 50),
        "p95": percentile(values, 95),
        "max": max(values) if values else float("nan"),
    }


def build_report(
    records: dict[str, list[dict[str, Any]]], deadline_ms: int, grace_ms: int, worker_starts: dict[str, int]
) -> tuple[dict[str, Any], list[str]]:
    bound_ms = deadline_ms + grace_ms + BOUND_SLACK_MS
    report: dict[str, Any] = {}
    for case in CASES:
        rows = records[case.key]
        counts = {o: sum(r["outcome"] == o for r in rows) for o in OUTCOMES}
        unexpected = next((r["message"] for r in rows if r["outcome"] != case.expected), None)
        killed = [r for r in rows if r["outcome"] == KILLED]
        elapsed = [float(r["elapsed_ms"]) for r in rows]
        report[case.key] = {
            "label": case.label,
            "code": case.code,
            "expected": case.expected,
            "counts": counts,
            "first_unexpected_message": unexpected,
            "elapsed_ms": stats(elapsed),
            "overshoot_ms": stats([float(r["overshoot_ms"]) for r in rows]),
            "overshoot_past_grace_ms": stats([float(r["overshoot_past_grace_ms"]) for r in killed]),
            "bound_ms": bound_ms,
            "bound_violations": sum(not r["within_bound"] for r in rows),
            "bound_met": bool(elapsed) and max(elapsed) <= bound_ms,
            "killed_by": dict(Counter(str(r["killed_by"]) for r in killed)),
            "kernel_still_running_at_return": sum(r.get("kernel_gone_at_return") is False for r in killed),
            "worker_starts": worker_starts[case.key],
        }

    n = max(len(rows) for rows in records.values())
    lines = [
        f"deadline_ms={deadline_ms}, interrupt_grace_ms={grace_ms}, bound = D + G + {BOUND_SLACK_MS} = {bound_ms} ms; "
        f"{n} trials per case",
        "overshoot = elapsed - D; past D+G = elapsed - D - G (killed trials only); all in ms",
        "",
    ]
    header = (
        f"{'case':29}{'expect':>12}{'int/kill/oth':>14}{'over med':>10}{'p95':>8}{'max':>8}"
        f"{'D+G med':>9}{'p95':>8}{'max':>8}{'max elapsed':>13}{'bound':>8}{'viol':>6}"
    )
    lines += [header, "-" * len(header)]
    for case in CASES:
        c = report[case.key]
        counts = "/".join(str(c["counts"][o]) for o in OUTCOMES)
        over, past = c["overshoot_ms"], c["overshoot_past_grace_ms"]
        past_cols = (
            f"{past['median']:9.0f}{past['p95']:8.0f}{past['max']:8.0f}" if past["n"] else f"{'-':>9}{'-':>8}{'-':>8}"
        )
        lines.append(
            f"{case.label:29}{case.expected:>12}{counts:>14}{over['median']:10.0f}{over['p95']:8.0f}{over['max']:8.0f}"
            f"{past_cols}{c['elapsed_ms']['max']:13.0f}{'ok' if c['bound_met'] else 'MISSED':>8}"
            f"{c['bound_violations']:6d}"
        )
    lines.append("")
    for case in CASES:
        c = report[case.key]
        notes = []
        if c["killed_by"]:
            notes.append("killed by " + ", ".join(f"{who} x{k}" for who, k in sorted(c["killed_by"].items())))
        notes.append(f"workers started: {c['worker_starts']}")
        if c["kernel_still_running_at_return"]:
            notes.append(f"old kernel still running at return x{c['kernel_still_running_at_return']}")
        if c["first_unexpected_message"] is not None:
            notes.append(f"first unexpected message: {c['first_unexpected_message'][:300]}")
        if notes:
            lines.append(f"{case.label}: " + "; ".join(notes))
    lines += killed_breakdown(records, bound_ms)
    total_violations = sum(report[case.key]["bound_violations"] for case in CASES)
    lines.append(f"bound violations (elapsed > {bound_ms} ms): {total_violations}")
    return report, lines


def killed_breakdown(records: dict[str, list[dict[str, Any]]], bound_ms: int) -> list[str]:
    """Killed trials by who ended the tree: when the kernel was seen gone, and when run() returned."""
    header = (
        f"{'killed trials: case / ended by':50}{'n':>4}{'kernel gone med':>17}{'max':>7}{'superv. gone':>14}{'max':>7}"
        f"{'returned':>10}{'max':>7}{'ret-superv.':>13}{'max':>7}{'viol':>6}"
    )
    lines = ["", header, "-" * len(header)]
    for case in CASES:
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in records[case.key]:
            if r["outcome"] == KILLED:
                groups.setdefault(str(r["killed_by"]), []).append(r)
        for who, rows in sorted(groups.items()):

            def cols(key: str, width: int, rows: list[dict[str, Any]] = rows) -> str:
                values = [float(r[key]) for r in rows if r.get(key) is not None]
                if not values:
                    return f"{'-':>{width}}{'-':>7}"
                return f"{percentile(values, 50):{width}.0f}{max(values):7.0f}"

            violations = sum(float(r["elapsed_ms"]) > bound_ms for r in rows)
            label = f"{case.label} / {who}"
            lines.append(
                f"{label:50}{len(rows):4d}{cols('kernel_ended_ms', 17)}{cols('supervisor_ended_ms', 14)}"
                f"{cols('elapsed_ms', 10)}{cols('return_after_supervisor_end_ms', 13)}{violations:6d}"
            )
    lines.append(
        f"(medians and max, ms after the call; processes polled every {EXIT_POLL_S * 1000:.0f} ms; "
        "ret-superv. = returned - supervisor gone)"
    )
    return lines


# --------------------------------------------------------------------------- bench/harness.py


def harness(ctx: Context) -> list[Metric]:
    """Every case's overshoot past the deadline (D = 1000 ms, G = 500 ms), trials interleaved."""
    from harness_api import OVERSHOOT, Metric

    deadline_ms, grace_ms, trials = 1000, 500, ctx.pick(smoke=1, full=10)
    captured = ctx.root / "workers-stderr.log"  # Bench.trial looks for the backstop's announcement there

    async def go(log: Callable[[str], None]) -> dict[str, list[dict[str, Any]]]:
        bench = Bench(ctx.root, deadline_ms, grace_ms, captured, log)
        try:
            return await run_trials(bench, trials, log)
        finally:
            await bench.close()

    with stderr_to(captured) as terminal:
        records = asyncio.run(go(lambda message: print(message, file=terminal, flush=True)))
    metrics = []
    for case in CASES:
        rows = records[case.key]
        unexpected = [r["message"] for r in rows if r["outcome"] != case.expected]
        if unexpected:
            ctx.notes.append(f"{case.label}: {len(unexpected)} unexpected outcome(s), first: {unexpected[0][:200]}")
        metrics.append(
            Metric(
                "deadline",
                f"overshoot past D: {case.label} ({case.expected})",
                "ms",
                [float(r["overshoot_ms"]) for r in rows],
                plot=OVERSHOOT,
            )
        )
    ctx.notes.append(
        f"D = {deadline_ms} ms, grace G = {grace_ms} ms; killed cases end after D + G, bound D + G + "
        f"{BOUND_SLACK_MS} ms; plain ipykernel has no deadline (its interrupt is in the interrupt row)"
    )
    return metrics


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trials", type=int, default=50, help="timed calls per case (default 50)")
    p.add_argument("--deadline-ms", type=int, default=1000, help="WorkerConfig.deadline_ms (default 1000)")
    p.add_argument("--grace-ms", type=int, default=500, help="WorkerConfig.interrupt_grace_ms (default 500)")
    p.add_argument("--quick", action="store_true", help="smoke mode: 5 trials per case")
    p.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR, help="where the JSON file goes")
    p.add_argument("--strict", action="store_true", help="exit 1 on a bound violation or an unexpected outcome")
    args = p.parse_args(argv)
    if args.quick:
        args.trials = 5
    if args.trials < 1:
        p.error("--trials must be at least 1")
    return args


def run(args: argparse.Namespace, root: Path, log: Callable[[str], None], captured: Path) -> int:
    started = datetime.now(UTC)
    folders = isolate_jupyter(root)
    load_before = os.getloadavg()
    t_run = time.monotonic()
    log(f"{len(CASES)} cases x {args.trials} trials, deadline {args.deadline_ms} ms, grace {args.grace_ms} ms")

    async def go() -> tuple[dict[str, list[dict[str, Any]]], dict[str, int]]:
        bench = Bench(root, args.deadline_ms, args.grace_ms, captured, log)
        try:
            return await run_trials(bench, args.trials, log), bench.worker_starts
        finally:
            await bench.close()

    records, worker_starts = asyncio.run(go())
    report, lines = build_report(records, args.deadline_ms, args.grace_ms, worker_starts)
    env = environment_info()
    load_after = os.getloadavg()
    duration = time.monotonic() - t_run
    print(
        f"ivralo deadline precision: {env['cpu_count']} CPUs, Python {env['python']}, "
        f"load avg {load_before[0]:.2f} -> {load_after[0]:.2f}, {duration:.0f} s\n"
    )
    print("\n".join(lines))
    record = {
        **record_header("deadline_precision", started, duration, args, env, (load_before, load_after)),
        "jupyter_folders": folders,
        "summary": report,
        "samples": records,
        "captured_stderr": captured_lines(captured)[:200],  # the host's warnings, workers' stderr
    }
    write_results(args.results_dir, "deadline_precision", started, record)
    print(
        f"stderr of the workers and the host: {len(record['captured_stderr'])} lines besides TCP warnings (in the JSON)"
    )
    bad = any(c["bound_violations"] or c["first_unexpected_message"] is not None for c in report.values())
    return 1 if (args.strict and bad) else 0


@contextlib.contextmanager
def stderr_to(path: Path) -> Iterator[TextIO]:
    """Send fd 2 (the workers inherit it; the host's logging writes to it) into ``path``; yield a
    stream on the original stderr for progress lines."""
    saved = os.dup(2)
    sys.stderr.flush()
    with path.open("ab") as sink:
        os.dup2(sink.fileno(), 2)
    try:
        with os.fdopen(os.dup(saved), "w", buffering=1) as terminal:
            yield terminal
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def captured_lines(path: Path) -> list[str]:
    """What the workers and the host wrote to stderr, without ipykernel's per-start TCP warning."""
    if not path.is_file():
        return []
    return [line for line in path.read_text(errors="replace").splitlines() if KNOWN_KERNEL_NOISE not in line]


def run_captured_bench(
    prefix: str,
    run: Callable[[Path, Callable[[str], None], Path], int],
    on_failure: Callable[[Path, Callable[[str], None]], None] | None = None,
) -> int:
    """``run_bench`` for benches whose workers' and host's stderr is captured in the run's folder
    (progress lines still reach the terminal); its tail is shown on a failure."""

    def run_captured(root: Path) -> int:
        captured = root / KERNEL_LOG
        with stderr_to(captured) as terminal:

            def log(message: str) -> None:
                print(message, file=terminal, flush=True)

            try:
                exit_code = run(root, log, captured)
            except BaseException:
                tail = "\n".join(captured_lines(captured)[-40:])
                log(f"--- end of the workers' and host's stderr ---\n{tail}")
                if on_failure is not None:
                    on_failure(root, log)
                raise
            finally:  # while the terminal is still ours; run_bench then finds nothing left
                leftover = reap_children(log)
            return 1 if leftover else exit_code

    return run_bench(prefix, run_captured, on_failure=lambda root: None)


def _show_worker_logs(root: Path, log: Callable[[str], None]) -> None:
    for worker_log in sorted((root / "workspaces").glob("*/.ivralo/*.log")):
        tail = "\n".join(worker_log.read_text(errors="replace").splitlines()[-20:])
        log(f"--- end of {worker_log.relative_to(root)} ---\n{tail}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_captured_bench(
        "ivralo-bench-deadline-", lambda root, log, captured: run(args, root, log, captured), _show_worker_logs
    )


if __name__ == "__main__":
    sys.exit(main())
