"""Start-up and round-trip latency of the ivralo kernel against plain ipykernel, in the same run.

What it measures, for each kernel kind (``ivralo`` kernelspec vs ipykernel's ``python3``):

1. **start-to-ready**: from ``KernelManager.start_kernel()`` to the first successful
   ``kernel_info_reply`` seen by ``client.wait_for_ready()`` (the moment jupyter_client accepts the
   reply and has checked that IOPub is connected), on a fresh kernel each trial. The time at which
   ``wait_for_ready()`` *returns* is recorded as well: it always adds jupyter_client's IOPub drain
   (it waits for 0.2 s of IOPub silence), the same for both kinds.
2. **1+1 round trip**: on one already-ready kernel of each kind, from ``client.execute("1+1")`` until
   both the ``status: idle`` on IOPub and the ``execute_reply`` on shell for that msg_id have arrived.

Both kinds are started by the same ``jupyter_client.KernelManager`` class and the same client class;
the ivralo kernelspec names its provisioner in ``kernel.json``, as in real use.

Why interleaved: this machine is small (2 cores) and shared, so its speed drifts over a run. Running
all of A and then all of B would fold that drift into the A/B ratio. Trials are run in pairs instead,
and the order alternates from pair to pair (A B, B A, A B, ...), so that neither kind always runs
right after the other's shutdown. Medians and p99 are reported; ratios are ivralo / plain.

Run: ``.venv/bin/python bench/startup_latency.py`` (``--quick`` for a smoke run). A JSON file with
every sample goes to ``bench/results/startup_latency-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:  # jupyter_client is imported only after Jupyter's folders are isolated
    from harness_api import Context, Metric
    from jupyter_client.blocking.client import BlockingKernelClient
    from jupyter_client.manager import KernelManager

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
DEFAULT_RESULTS_DIR = BENCH_DIR / "results"

PLAIN, IVRALO = "plain", "ivralo"
KINDS = (PLAIN, IVRALO)
KERNEL_NAMES = {PLAIN: "python3", IVRALO: "ivralo"}

# Targets from the issue: ivralo median / plain median.
TARGET_START_RATIO = 1.3
TARGET_ROUNDTRIP_RATIO = 1.1

ROUNDTRIP_CODE = "1+1"
KERNEL_LOG = "kernels.log"  # in the run's temp folder: both kinds' stdout/stderr
KNOWN_KERNEL_NOISE = "without encryption"  # ipykernel's TCP warning, once per kernel

START_METRICS = (
    "ready_ms",
    "wait_for_ready_returned_ms",
    "start_kernel_call_ms",
    "kernel_info_requests",
    "shutdown_ms",
    "bootstrap_ms",  # ivralo only
    "supervisor_to_kernel_fork_ms",  # ivralo only
)
ROUNDTRIP_METRICS = ("roundtrip_ms", "reply_ms", "idle_ms")


# --------------------------------------------------------------------------- environment


def isolate_jupyter(root: Path) -> dict[str, str]:
    """Point every Jupyter/IPython folder into ``root`` and install the ivralo kernelspec there.

    Must run before jupyter_client is imported. Returns the folders, for the JSON record.
    """
    folders = {
        "JUPYTER_CONFIG_DIR": root / "jupyter-config",
        "JUPYTER_DATA_DIR": root / "jupyter-data",
        "JUPYTER_RUNTIME_DIR": root / "jupyter-runtime",
        "IPYTHONDIR": root / "ipython",
    }
    for name, folder in folders.items():
        folder.mkdir(parents=True, exist_ok=True)
        os.environ[name] = str(folder)
    os.environ["JUPYTER_PLATFORM_DIRS"] = "1"
    prefix = root / "prefix"
    os.environ["JUPYTER_PATH"] = str(prefix / "share" / "jupyter")

    from ivralo_kernel.cli.install import install  # imports jupyter_client: only now

    spec_dir = install(prefix=str(prefix))
    record = {k: str(v) for k, v in folders.items()}
    return {**record, "JUPYTER_PATH": os.environ["JUPYTER_PATH"], "ivralo_spec": spec_dir}


def install_spec_with(name: str, **provisioner_config: Any) -> str:
    """An ivralo kernelspec ``name`` with these provisioner settings (e.g. ``sandbox="off"``), next to
    the one ``isolate_jupyter`` installed; returns its name, for ``Bench.kernel_names``."""
    from ivralo_kernel.host.jupyter.kernelspec import kernel_spec_dict

    spec_dir = Path(os.environ["JUPYTER_PATH"]) / "kernels" / name
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = kernel_spec_dict(python=sys.executable, provisioner_config=provisioner_config)
    (spec_dir / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
    return name


def timed_client_class() -> type[BlockingKernelClient]:
    """A BlockingKernelClient that notes when ``wait_for_ready`` accepted its kernel_info_reply."""
    from jupyter_client.blocking.client import BlockingKernelClient

    class TimedClient(BlockingKernelClient):  # type: ignore[misc]
        ready_at: float | None = None
        kernel_info_requests = 0

        def kernel_info(self) -> str:
            self.kernel_info_requests += 1
            return str(super().kernel_info())

        def _handle_kernel_info_reply(self, msg: dict[str, Any]) -> None:
            # wait_for_ready calls this once, right after the reply and an IOPub message arrived.
            if self.ready_at is None:
                self.ready_at = time.perf_counter()
            super()._handle_kernel_info_reply(msg)

    return TimedClient


# --------------------------------------------------------------------------- statistics


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default); with 15 samples p99 is close to the max."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summary(values: list[float]) -> dict[str, float | int]:
    return {
        "n": len(values),
        "median": percentile(values, 50),
        "p99": percentile(values, 99),
        "min": min(values) if values else math.nan,
        "max": max(values) if values else math.nan,
    }


def ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


def pairs(n: int) -> Iterator[tuple[int, tuple[str, str]]]:
    """Trial index and run order: plain/ivralo, then ivralo/plain, alternating."""
    for i in range(n):
        yield i, (KINDS if i % 2 == 0 else KINDS[::-1])


# --------------------------------------------------------------------------- kernel helpers


def drain(channel: Any) -> list[dict[str, Any]]:
    """Every message already waiting on a channel, without blocking.

    (jupyter_client 8's ``ZMQSocketChannel.get_msgs()`` calls ``get_msg()`` with no timeout, which
    blocks once the channel is empty.)
    """
    msgs = []
    while channel.msg_ready():
        msgs.append(channel.get_msg(timeout=0))
    return msgs


def await_reply(kc: BlockingKernelClient, msg_id: str, timeout: float) -> dict[str, Any]:
    """The shell reply whose parent is ``msg_id`` (stale replies, e.g. from wait_for_ready, are skipped)."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no shell reply to {msg_id} within {timeout} s")
        msg: dict[str, Any] = kc.get_shell_msg(timeout=remaining)
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg


def shutdown(km: KernelManager, kc: BlockingKernelClient | None) -> float:
    """Stop channels and kill the kernel now; return how long the shutdown took (ms)."""
    t0 = time.perf_counter()
    try:
        if kc is not None:
            kc.stop_channels()
    finally:
        if km.has_kernel:
            km.shutdown_kernel(now=True)
    return (time.perf_counter() - t0) * 1000


def create_time(pid: int | None) -> float | None:
    import psutil

    if pid is None:
        return None
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


class Bench:
    def __init__(self, workspace: Path, runtime_dir: Path, kernel_log: IO[bytes], timeout: float) -> None:
        from jupyter_client.manager import KernelManager

        self.workspace = workspace
        self.runtime_dir = runtime_dir
        self.kernel_log = kernel_log  # both kinds' stdout/stderr (ipykernel's TCP warning, tracebacks)
        self.timeout = timeout
        self.manager_class = KernelManager
        self.client_class = timed_client_class()
        self.kernel_names = dict(KERNEL_NAMES)  # a bench may run ivralo with other settings

    def new_manager(self, kind: str) -> KernelManager:
        return self.manager_class(
            kernel_name=self.kernel_names[kind],
            client_factory=self.client_class,
            connection_file=str(self.runtime_dir / f"kernel-{kind}-{uuid.uuid4()}.json"),
        )

    def start(self, km: KernelManager) -> tuple[BlockingKernelClient, dict[str, float]]:
        """Start a kernel and wait until it is ready; return the client and the timings (ms)."""
        t0 = time.perf_counter()
        km.start_kernel(cwd=str(self.workspace), stdout=self.kernel_log, stderr=self.kernel_log)
        t_launched = time.perf_counter()
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=self.timeout)
        except BaseException:
            kc.stop_channels()  # the caller shuts the kernel down; it never sees this client
            raise
        t_returned = time.perf_counter()
        if kc.ready_at is None:  # not reachable with jupyter_client 8; keep the number honest anyway
            raise RuntimeError("wait_for_ready returned without a kernel_info_reply")
        times = {
            "ready_ms": (kc.ready_at - t0) * 1000,
            "wait_for_ready_returned_ms": (t_returned - t0) * 1000,
            "start_kernel_call_ms": (t_launched - t0) * 1000,
            "kernel_info_requests": float(kc.kernel_info_requests),
        }
        return kc, times

    def start_trial(self, kind: str) -> dict[str, Any]:
        km = self.new_manager(kind)
        kc: BlockingKernelClient | None = None
        record: dict[str, Any] = {"kind": kind}
        try:
            kc, times = self.start(km)
            record.update(times)
            # Identify the processes, and read ivralo's own report of its bootstrap.
            reply = await_reply(kc, kc.kernel_info(), self.timeout)
            section = reply["content"].get("ivralo")
            host_pid = km.provisioner.process.pid if km.provisioner and km.provisioner.process else None
            record["host_child_pid"] = host_pid
            if section is not None:
                record["ivralo"] = section
                record["bootstrap_ms"] = section.get("bootstrap_ms")
                sup, ker = create_time(host_pid), create_time(section.get("pid"))
                # psutil's create_time has a 10 ms resolution: this split is approximate.
                if sup is not None and ker is not None:
                    record["supervisor_to_kernel_fork_ms"] = (ker - sup) * 1000
        finally:
            record["shutdown_ms"] = shutdown(km, kc)
        return record

    def roundtrip(self, kc: BlockingKernelClient, code: str = ROUNDTRIP_CODE) -> dict[str, float]:
        """One execute (``1+1``): time to execute_reply, to idle, and to both (ms)."""
        import zmq

        shell, iopub = kc.shell_channel, kc.iopub_channel
        drain(iopub)  # leftovers of earlier requests would only be skipped, but cost time to skip
        poller = zmq.Poller()
        poller.register(shell.socket, zmq.POLLIN)
        poller.register(iopub.socket, zmq.POLLIN)
        t0 = time.perf_counter()
        msg_id = kc.execute(code)
        t_reply: float | None = None
        t_idle: float | None = None
        deadline = time.monotonic() + self.timeout
        while t_reply is None or t_idle is None:
            remaining_ms = (deadline - time.monotonic()) * 1000
            if remaining_ms <= 0:
                raise TimeoutError(f"no reply/idle for {code!r} within {self.timeout} s")
            events = dict(poller.poll(remaining_ms))
            now = time.perf_counter()
            if shell.socket in events:
                for msg in drain(shell):
                    if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "execute_reply":
                        if msg["content"]["status"] != "ok":
                            raise RuntimeError(f"{code[:80]!r} failed: {msg['content']}")
                        t_reply = now
            if iopub.socket in events:
                for msg in drain(iopub):
                    if (
                        msg["parent_header"].get("msg_id") == msg_id
                        and msg["msg_type"] == "status"
                        and msg["content"]["execution_state"] == "idle"
                    ):
                        t_idle = now
        return {
            "roundtrip_ms": (max(t_reply, t_idle) - t0) * 1000,
            "reply_ms": (t_reply - t0) * 1000,
            "idle_ms": (t_idle - t0) * 1000,
        }


# --------------------------------------------------------------------------- phases


def run_starts(bench: Bench, trials: int, warmup: int, log: Callable[[str], None]) -> dict[str, list[dict[str, Any]]]:
    for i in range(warmup):
        for kind in KINDS:
            bench.start_trial(kind)
        log(f"  start warm-up {i + 1}/{warmup} done")
    records: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    for i, order in pairs(trials):
        for kind in order:
            records[kind].append(bench.start_trial(kind))
        last = {kind: records[kind][-1]["ready_ms"] for kind in KINDS}
        log(f"  start pair {i + 1}/{trials}: plain {last[PLAIN]:.0f} ms, ivralo {last[IVRALO]:.0f} ms")
    return records


def run_roundtrips(
    bench: Bench, trials: int, warmup: int, log: Callable[[str], None]
) -> dict[str, list[dict[str, float]]]:
    managers: dict[str, KernelManager] = {}
    clients: dict[str, BlockingKernelClient] = {}
    records: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    try:
        for kind in KINDS:
            managers[kind] = bench.new_manager(kind)
            clients[kind], _ = bench.start(managers[kind])
        for _ in range(warmup):
            for kind in KINDS:
                bench.roundtrip(clients[kind])
        for _, order in pairs(trials):
            for kind in order:
                records[kind].append(bench.roundtrip(clients[kind]))
        log(f"  {trials} round trips per kind done")
    finally:
        for kind, km in managers.items():
            shutdown(km, clients.get(kind))
    return records


# --------------------------------------------------------------------------- report


def column(records: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in records if r.get(key) is not None]


def build_report(
    starts: dict[str, list[dict[str, Any]]], rts: dict[str, list[dict[str, float]]]
) -> tuple[dict[str, Any], list[str]]:
    s = {kind: {key: summary(column(starts[kind], key)) for key in START_METRICS} for kind in KINDS}
    r = {kind: {key: summary(column(rts[kind], key)) for key in ROUNDTRIP_METRICS} for kind in KINDS}

    def ratios(stats: dict[str, dict[str, dict[str, float | int]]], key: str) -> dict[str, float]:
        return {q: ratio(float(stats[IVRALO][key][q]), float(stats[PLAIN][key][q])) for q in ("median", "p99")}

    start_ratio, rt_ratio = ratios(s, "ready_ms"), ratios(r, "roundtrip_ms")
    targets = {
        "start_median_ratio": {"target": TARGET_START_RATIO, "value": start_ratio["median"]},
        "roundtrip_median_ratio": {"target": TARGET_ROUNDTRIP_RATIO, "value": rt_ratio["median"]},
    }
    for t in targets.values():
        t["met"] = bool(t["value"] <= t["target"])

    lines: list[str] = []
    n_start, n_rt = s[PLAIN]["ready_ms"]["n"], r[PLAIN]["roundtrip_ms"]["n"]
    header = f"{'':34}{'plain ms':>10}{'ivralo ms':>11}{'ratio':>8}"
    lines.append(f"start-to-ready ({n_start} fresh kernels each) and {ROUNDTRIP_CODE!r} round trip ({n_rt} each)")
    lines.append(header)
    lines.append("-" * len(header))

    def row(label: str, stats: dict[str, Any], key: str, q: str, verdict: str = "") -> None:
        a, b = float(stats[PLAIN][key][q]), float(stats[IVRALO][key][q])
        lines.append(f"{label:34}{a:10.1f}{b:11.1f}{ratio(b, a):8.2f}  {verdict}".rstrip())

    def verdict(name: str) -> str:
        t = targets[name]
        return f"target <= {t['target']}x: {'MET' if t['met'] else 'MISSED'}"

    row("start-to-ready median", s, "ready_ms", "median", verdict("start_median_ratio"))
    row("start-to-ready p99", s, "ready_ms", "p99")
    row("round trip median", r, "roundtrip_ms", "median", verdict("roundtrip_median_ratio"))
    row("round trip p99", r, "roundtrip_ms", "p99")
    lines.append("")
    lines.append("details (medians)")
    row("  start_kernel() call", s, "start_kernel_call_ms", "median")
    row("  wait_for_ready() returned", s, "wait_for_ready_returned_ms", "median")
    row("  kernel shutdown (now=True)", s, "shutdown_ms", "median")
    row("  round trip: execute_reply", r, "reply_ms", "median")
    row("  round trip: status idle", r, "idle_ms", "median")
    kir = {kind: column(starts[kind], "kernel_info_requests") for kind in KINDS}
    lines.append(f"  {'kernel_info requests until ready':32}{max(kir[PLAIN]):10.0f}{max(kir[IVRALO]):11.0f}  (max)")

    iv = s[IVRALO]
    if iv["bootstrap_ms"]["n"]:
        ready = float(iv["ready_ms"]["median"])
        call = float(iv["start_kernel_call_ms"]["median"])
        fork = float(iv["supervisor_to_kernel_fork_ms"]["median"])
        boot = float(iv["bootstrap_ms"]["median"])
        lines.append("")
        lines.append("ivralo start-to-ready breakdown (medians, ms; the fork split has 10 ms resolution)")
        lines.append(f"  {'start_kernel() call (host side)':36}{call:8.1f}")
        lines.append(f"  {'supervisor up to kernel fork (approx)':36}{fork:8.1f}")
        lines.append(f"  {'kernel bootstrap (bootstrap_ms)':36}{boot:8.1f}")
        lines.append(f"  {'rest (app.start, first kernel_info)':36}{ready - call - fork - boot:8.1f}")
        lines.append(f"  {'= start-to-ready':36}{ready:8.1f}")
    lines.append("")
    for name in targets:
        lines.append(f"{name}: {targets[name]['value']:.3f} ({verdict(name)})")

    report = {
        "start": s,
        "roundtrip": r,
        "ratios": {"start_ready": start_ratio, "roundtrip": rt_ratio},
        "targets": targets,
    }
    return report, lines


# --------------------------------------------------------------------------- bench/harness.py


def harness(ctx: Context) -> list[Metric]:
    """Start to ready on fresh kernels, and the ``1+1`` round trip, in interleaved pairs."""
    from harness_api import LATENCY, Metric

    workspace = ctx.root / "workspace"
    workspace.mkdir()
    bench = Bench(workspace, Path(os.environ["JUPYTER_RUNTIME_DIR"]), ctx.kernel_log, ctx.timeout)
    trials, warmup = ctx.pick(smoke=(2, 0), full=(20, 1))
    starts = run_starts(bench, trials, warmup, ctx.log)
    rts = run_roundtrips(bench, ctx.pick(smoke=20, full=200), ctx.pick(smoke=2, full=5), ctx.log)
    return [
        Metric(
            "start",
            "start to ready",
            "ms",
            column(starts[IVRALO], "ready_ms"),
            column(starts[PLAIN], "ready_ms"),
            plot=LATENCY,
        ),
        Metric(
            "round trip",
            "1+1 (reply and idle)",
            "ms",
            column(rts[IVRALO], "roundtrip_ms"),
            column(rts[PLAIN], "roundtrip_ms"),
            plot=LATENCY,
        ),
    ]


def environment_info() -> dict[str, Any]:
    import ipykernel
    import jupyter_client

    def git(*args: str) -> str:
        try:
            return subprocess.run(
                ["git", "-C", str(REPO_DIR), *args], capture_output=True, text=True, check=False, timeout=10
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""

    commit = git("rev-parse", "HEAD").strip()
    dirty = [line[3:] for line in git("status", "--porcelain", "--untracked-files=no").splitlines()]
    return {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "ipykernel": ipykernel.__version__,
        "jupyter_client": jupyter_client.__version__,
        "git_commit": commit,
        "git_modified_files": dirty,  # the numbers describe HEAD plus these working-tree changes
    }


def reap_children(log: Callable[[str], None]) -> list[int]:
    """Warn about and kill (by pid) any process this script left behind."""
    import psutil

    left = psutil.Process().children(recursive=True)
    for proc in left:
        try:
            log(f"WARNING: left-over child process {proc.pid} ({' '.join(proc.cmdline())[:120]}); killing it")
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=5)
    return [p.pid for p in left]


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trials", type=int, default=15, help="fresh kernels started per kind (default 15)")
    p.add_argument("--roundtrips", type=int, default=200, help="'1+1' executions per kind (default 200)")
    p.add_argument("--warmup", type=int, default=5, help="untimed executions per kernel first (default 5)")
    p.add_argument("--warmup-starts", type=int, default=1, help="untimed kernel starts per kind first (default 1)")
    p.add_argument("--quick", action="store_true", help="smoke mode: 3 trials, 30 round trips")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a kernel gets to become ready (default 60)")
    p.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR, help="where the JSON file goes")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = p.parse_args(argv)
    if args.quick:
        args.trials, args.roundtrips = 3, 30
    if args.trials < 1 or args.roundtrips < 1:
        p.error("--trials and --roundtrips must be at least 1")
    return args


def run(args: argparse.Namespace, root: Path, log: Callable[[str], None]) -> int:
    started = datetime.now(UTC)
    folders = isolate_jupyter(root)
    workspace = root / "workspace"
    workspace.mkdir()
    with (root / KERNEL_LOG).open("wb") as kernel_log:
        bench = Bench(workspace, Path(folders["JUPYTER_RUNTIME_DIR"]), kernel_log, args.timeout)
        load_before = os.getloadavg()
        t_run = time.monotonic()
        log(f"start-to-ready: {args.trials} interleaved pairs (+{args.warmup_starts} warm-up start per kind)")
        starts = run_starts(bench, args.trials, args.warmup_starts, log)
        log(f"round trips: {args.roundtrips} interleaved pairs (+{args.warmup} warm-up executions per kind)")
        rts = run_roundtrips(bench, args.roundtrips, args.warmup, log)
    report, lines = build_report(starts, rts)
    env = environment_info()
    load_after = os.getloadavg()
    print(
        f"ivralo vs plain ipykernel: {env['cpu_count']} CPUs, Python {env['python']}, "
        f"ipykernel {env['ipykernel']}, jupyter_client {env['jupyter_client']}, "
        f"load avg {load_before[0]:.2f} -> {load_after[0]:.2f}\n"
    )
    print("\n".join(lines))
    record = {
        **record_header("startup_latency", started, time.monotonic() - t_run, args, env, (load_before, load_after)),
        "jupyter_folders": folders,
        "summary": report,
        "samples": {"start": starts, "roundtrip": rts},
    }
    write_results(args.results_dir, "startup_latency", started, record)
    missed = [name for name, t in report["targets"].items() if not t["met"]]
    return 1 if (args.strict and missed) else 0


def record_header(
    name: str,
    started: datetime,
    duration: float,
    args: argparse.Namespace,
    env: dict[str, Any],
    loadavg: tuple[tuple[float, float, float], tuple[float, float, float]],
) -> dict[str, Any]:
    """The first keys of every bench's JSON record: what ran, when, how, and on what machine."""
    return {
        "benchmark": name,
        "started_at": started.isoformat(),
        "duration_s": round(duration, 1),
        "params": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "environment": {**env, "loadavg_before": loadavg[0], "loadavg_after": loadavg[1]},
    }


def write_results(results_dir: Path, name: str, started: datetime, record: dict[str, Any]) -> Path:
    """The run's JSON record as ``results_dir/<name>-<UTC>.json`` (shared by the bench scripts)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    out = results_dir / f"{name}-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.write_text(json.dumps(record, indent=1, default=str) + "\n", encoding="utf-8")
    print(f"\nresults: {out}")
    return out


def log_kernel_output_tail(root: Path, log: Callable[[str], None]) -> None:
    """After a failed run: the last lines the kernels wrote, less known noise."""
    kernel_output = root / KERNEL_LOG
    if kernel_output.is_file():
        lines = kernel_output.read_text(errors="replace").splitlines()
        tail = "\n".join([line for line in lines if KNOWN_KERNEL_NOISE not in line][-40:])
        if tail:
            log(f"--- end of the kernels' output ---\n{tail}")


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # so that the finally blocks shut the kernels down


def log_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_bench(
    prefix: str,
    run: Callable[[Path], int],
    log: Callable[[str], None] = log_to_stderr,
    on_failure: Callable[[Path], None] | None = None,
) -> int:
    """Every bench's frame: a private folder, SIGTERM turned into an exit (so that the finally
    blocks shut the kernels down), the kernels' output tail on a failure, then every child reaped
    (a leftover fails the run) and the folder removed."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    root = Path(tempfile.mkdtemp(prefix=prefix))
    exit_code = 1
    try:
        exit_code = run(root)
    except BaseException:
        (on_failure or (lambda folder: log_kernel_output_tail(folder, log)))(root)
        raise
    finally:
        if reap_children(log):
            exit_code = 1
        shutil.rmtree(root, ignore_errors=True)
    return exit_code


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_bench("ivralo-bench-", lambda root: run(args, root, log_to_stderr))


if __name__ == "__main__":
    sys.exit(main())
