"""Memory of an idle ivralo worker against an idle plain ipykernel, in the same run.

K kernels of each kind (default 5; ``--quick``: 2) are started by the same
``jupyter_client.KernelManager`` (kernel names ``ivralo`` and ipykernel's ``python3``), in
alternating order, and all are kept alive together. Each one is brought to ``wait_for_ready``, runs
``pass`` (so whatever the first execution loads is loaded), and is idle again (its ``status: idle``
and ``execute_reply`` for that request have arrived). After a settle pause, every kernel is sampled
with psutil a few times, interleaved across kernels; each kernel's value is the median of its samples.

Measured (RSS always; USS and PSS from ``memory_full_info()`` where the platform has them):

* ivralo: (a) the **kernel** process, i.e. the supervisor's child
  (``psutil.Process(km.provisioner.pid).children()``), checked against the pid in the ``ivralo``
  section of ``kernel_info_reply``; (b) the **supervisor** (``km.provisioner.pid``); (c) the **tree**:
  the supervisor and all its descendants, summed.
* plain: the kernel process (``km.provisioner.pid``); its tree is itself plus any descendants.

Reported: medians over the K kernels of each kind and the ratios ivralo / plain for the kernel alone
and for the tree. Summed RSS/USS of a tree is not the same thing: RSS counts pages shared between
the supervisor and the kernel twice, USS counts them in neither; PSS splits them and is the fairest
tree total.

Run: ``.venv/bin/python bench/idle_rss.py`` (``--quick`` for 2 kernels per kind). A JSON file with
every sample goes to ``bench/results/idle_rss-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from startup_latency import (
    DEFAULT_RESULTS_DIR,
    IVRALO,
    KERNEL_LOG,
    KINDS,
    PLAIN,
    Bench,
    await_reply,
    environment_info,
    isolate_jupyter,
    log_to_stderr,
    pairs,
    percentile,
    record_header,
    run_bench,
    shutdown,
    write_results,
)

if TYPE_CHECKING:  # jupyter_client is imported only after Jupyter's folders are isolated
    import psutil
    from harness_api import Context, Metric
    from jupyter_client.blocking.client import BlockingKernelClient
    from jupyter_client.manager import KernelManager

MIB = 1 << 20
MEMORY_FIELDS = ("rss", "uss", "pss")
ROLES = ("kernel", "supervisor", "tree")  # plain kernels have no supervisor


def memory_of(proc: psutil.Process) -> dict[str, float]:
    """RSS, and USS/PSS when ``memory_full_info()`` provides them (bytes)."""
    import psutil

    try:
        info = proc.memory_full_info()
    except (psutil.AccessDenied, NotImplementedError):
        info = proc.memory_info()
    return {field: float(getattr(info, field)) for field in MEMORY_FIELDS if hasattr(info, field)}


def add(total: dict[str, float], part: dict[str, float]) -> None:
    for field, value in part.items():
        total[field] = total.get(field, 0.0) + value


def execute_and_wait_idle(kc: BlockingKernelClient, code: str, timeout: float) -> None:
    """Run ``code`` and return once its execute_reply (status ok) and ``status: idle`` have arrived."""
    msg_id = kc.execute(code)
    reply = await_reply(kc, msg_id, timeout)
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"{code!r} failed: {reply['content']}")
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no status: idle for {code!r} within {timeout} s")
        msg: dict[str, Any] = kc.get_iopub_msg(timeout=remaining)
        if (
            msg["parent_header"].get("msg_id") == msg_id
            and msg["msg_type"] == "status"
            and msg["content"]["execution_state"] == "idle"
        ):
            return


class Kernel:
    """One running kernel of either kind and the processes to sample."""

    def __init__(self, kind: str, km: KernelManager, kc: BlockingKernelClient, timeout: float) -> None:
        import psutil

        self.kind, self.km, self.kc = kind, km, kc
        self.samples: list[dict[str, dict[str, float]]] = []
        root_pid = km.provisioner.pid if km.provisioner else None
        if root_pid is None:
            raise RuntimeError(f"{kind}: the provisioner has no pid")
        self.root = psutil.Process(root_pid)
        self.info: dict[str, Any] = {"kind": kind, "root_pid": root_pid, "root_cmdline": self.root.cmdline()[:6]}
        if kind == PLAIN:
            self.kernel, self.supervisor = self.root, None
        else:
            # supervisor -> kernel; in the OS sandbox, bwrap -> supervisor -> kernel (in a PID namespace).
            by_module = {
                module: proc
                for proc in [self.root, *self.root.children(recursive=True)]
                for module in ("ivralo_kernel.supervisor", "ivralo_kernel.kernel")
                if module in proc.cmdline()
            }
            if len(by_module) != 2:
                raise RuntimeError(f"ivralo tree {root_pid} has no supervisor and kernel: {sorted(by_module)}")
            self.kernel, self.supervisor = by_module["ivralo_kernel.kernel"], by_module["ivralo_kernel.supervisor"]
            self.info["sandboxed"] = self.supervisor is not self.root
            section = await_reply(kc, kc.kernel_info(), timeout)["content"].get("ivralo") or {}
            self.info["kernel_info_pid"] = section.get("pid")
            # In the sandbox the kernel reports its pid in the sandbox's namespace.
            if not self.info["sandboxed"] and section.get("pid") != self.kernel.pid:
                raise RuntimeError(f"supervisor's child {self.kernel.pid} is not the kernel ({section.get('pid')})")
        self.info["kernel_pid"] = self.kernel.pid

    def sample(self) -> None:
        tree_procs = [self.root, *self.root.children(recursive=True)]
        tree: dict[str, float] = {}
        for proc in tree_procs:
            add(tree, memory_of(proc))
        record = {"kernel": memory_of(self.kernel), "tree": tree, "tree_processes": {"n": float(len(tree_procs))}}
        if self.supervisor is not None:
            record["supervisor"] = memory_of(self.supervisor)
        self.samples.append(record)

    def medians(self) -> dict[str, dict[str, float]]:
        """Per role and field: the median over this kernel's samples."""
        out: dict[str, dict[str, float]] = {}
        for role in (*ROLES, "tree_processes"):
            rows = [s[role] for s in self.samples if role in s]
            if rows:
                out[role] = {f: percentile([r[f] for r in rows], 50) for f in rows[0]}
        return out


# --------------------------------------------------------------------------- phases


def start_all(bench: Bench, per_kind: int, timeout: float, kernels: list[Kernel], log: Callable[[str], None]) -> None:
    """Start ``per_kind`` kernels of each kind, alternating; each runs ``pass`` and is idle again.

    ``kernels`` is filled as they come up, so the caller can shut down what started even on failure.
    """
    for i, order in pairs(per_kind):
        for kind in order:
            km = bench.new_manager(kind)
            try:
                kc, times = bench.start(km)
            except BaseException:
                shutdown(km, None)
                raise
            try:
                kernel = Kernel(kind, km, kc, timeout)
            except BaseException:
                shutdown(km, kc)
                raise
            kernels.append(kernel)
            execute_and_wait_idle(kc, "pass", timeout)
            kernel.info["ready_ms"] = times["ready_ms"]
            log(f"  {kind} kernel {i + 1}/{per_kind} ready in {times['ready_ms']:.0f} ms, ran 'pass', idle")


def sample_all(kernels: list[Kernel], samples: int, interval: float, log: Callable[[str], None]) -> None:
    for n in range(samples):
        if n:
            time.sleep(interval)
        for kernel in kernels:
            kernel.sample()
    log(f"  sampled {len(kernels)} kernels {samples} times")


# --------------------------------------------------------------------------- report


def build_report(kernels: list[Kernel]) -> tuple[dict[str, Any], list[str]]:
    per_kernel = {kind: [k.medians() for k in kernels if k.kind == kind] for kind in KINDS}

    def median(kind: str, role: str, field: str) -> float:
        values = [m[role][field] for m in per_kernel[kind] if role in m and field in m[role]]
        return percentile(values, 50) / MIB if values else float("nan")

    fields = [f for f in MEMORY_FIELDS if all(f in m["kernel"] for ms in per_kernel.values() for m in ms)]
    medians = {
        kind: {
            role: {f: median(kind, role, f) for f in fields} for role in ROLES if kind == IVRALO or role != "supervisor"
        }
        for kind in KINDS
    }

    def ratio(a: float, b: float) -> float:
        return a / b if b else float("nan")

    ratios = {
        "kernel_only": {f: ratio(medians[IVRALO]["kernel"][f], medians[PLAIN]["kernel"][f]) for f in fields},
        "tree": {f: ratio(medians[IVRALO]["tree"][f], medians[PLAIN]["tree"][f]) for f in fields},
    }
    n = {kind: len(per_kernel[kind]) for kind in KINDS}
    lines = [f"idle memory, MiB: median over {n[PLAIN]} plain and {n[IVRALO]} ivralo kernels", ""]
    header = f"{'':28}{'plain':>10}{'ivralo':>10}{'ratio':>8}"
    lines += [header, "-" * len(header)]
    for role, key in (("kernel", "kernel_only"), ("supervisor", None), ("tree", "tree")):
        for f in fields:
            iv = medians[IVRALO][role][f]
            if role == "supervisor":
                lines.append(f"{'ivralo supervisor ' + f.upper():28}{'-':>10}{iv:10.1f}")
                continue
            pl = medians[PLAIN][role][f]
            label = f"{'kernel process' if role == 'kernel' else 'process tree (sum)'} {f.upper()}"
            lines.append(f"{label:28}{pl:10.1f}{iv:10.1f}{ratios[str(key)][f]:8.2f}")
    procs = {kind: sorted({int(m["tree_processes"]["n"]) for m in per_kernel[kind]}) for kind in KINDS}
    lines.append("")
    lines.append(f"processes per tree: plain {procs[PLAIN]}, ivralo {procs[IVRALO]}")
    if "pss" in fields:
        lines.append("tree RSS counts pages shared by supervisor and kernel twice; tree PSS splits them")
    report = {"median_mib": medians, "ratios": ratios, "per_kernel_bytes": per_kernel, "fields": fields}
    return report, lines


# --------------------------------------------------------------------------- bench/harness.py


def harness(ctx: Context) -> list[Metric]:
    """K idle kernels of each kind, all alive together; kernel i of ivralo is paired with kernel i of
    plain (started one after the other)."""
    from harness_api import MEMORY, Metric

    per_kind, settle, samples = ctx.pick(smoke=(1, 0.5, 1), full=(5, 3.0, 5))
    workspace = ctx.root / "workspace"
    workspace.mkdir()
    bench = Bench(workspace, Path(os.environ["JUPYTER_RUNTIME_DIR"]), ctx.kernel_log, ctx.timeout)
    kernels: list[Kernel] = []
    try:
        start_all(bench, per_kind, ctx.timeout, kernels, ctx.log)
        time.sleep(settle)  # not a synchronisation: lets the idle kernels' memory settle before sampling
        sample_all(kernels, samples, 0.5, ctx.log)
    finally:
        for kernel in kernels:
            shutdown(kernel.km, kernel.kc)
    medians = {kind: [k.medians() for k in kernels if k.kind == kind] for kind in KINDS}
    field = "pss" if all("pss" in m["tree"] for ms in medians.values() for m in ms) else "rss"

    def series(kind: str, role: str, f: str) -> list[float]:
        return [m[role][f] / MIB for m in medians[kind]]

    return [
        Metric(
            "memory",
            f"idle process tree, {field.upper()}",
            "MiB",
            series(IVRALO, "tree", field),
            series(PLAIN, "tree", field),
            plot=MEMORY,
            note="ivralo's tree: the sandbox's bwrap, the supervisor, the kernel",
        ),
        Metric(
            "memory",
            f"idle kernel process, {field.upper()}",
            "MiB",
            series(IVRALO, "kernel", field),
            series(PLAIN, "kernel", field),
            plot=MEMORY,
        ),
        Metric(
            "memory",
            "idle process tree, USS",
            "MiB",
            series(IVRALO, "tree", "uss"),
            series(PLAIN, "tree", "uss"),
            plot=MEMORY,
        ),
    ]


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--kernels", type=int, default=5, help="kernels of each kind, all alive together (default 5)")
    p.add_argument("--settle", type=float, default=3.0, help="seconds to wait once all are idle (default 3)")
    p.add_argument("--samples", type=int, default=5, help="psutil samples per kernel (default 5)")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between sampling rounds (default 0.5)")
    p.add_argument("--quick", action="store_true", help="smoke mode: 2 kernels per kind, 1 s settle, 3 samples")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a kernel gets to become ready (default 60)")
    p.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR, help="where the JSON file goes")
    args = p.parse_args(argv)
    if args.quick:
        args.kernels, args.settle, args.samples = 2, 1.0, 3
    if args.kernels < 1 or args.samples < 1:
        p.error("--kernels and --samples must be at least 1")
    return args


def run(args: argparse.Namespace, root: Path, kernel_log: IO[bytes], log: Callable[[str], None]) -> int:
    started = datetime.now(UTC)
    folders = isolate_jupyter(root)
    workspace = root / "workspace"
    workspace.mkdir()
    bench = Bench(workspace, Path(folders["JUPYTER_RUNTIME_DIR"]), kernel_log, args.timeout)
    load_before = os.getloadavg()
    t_run = time.monotonic()
    kernels: list[Kernel] = []
    try:
        log(f"starting {args.kernels} kernels per kind, alternating; all stay up")
        start_all(bench, args.kernels, args.timeout, kernels, log)
        log(f"all idle; settling {args.settle:.1f} s")
        time.sleep(args.settle)
        sample_all(kernels, args.samples, args.interval, log)
    finally:
        for kernel in kernels:
            shutdown(kernel.km, kernel.kc)
        log(f"  shut down {len(kernels)} kernels")
    report, lines = build_report(kernels)
    env = environment_info()
    load_after = os.getloadavg()
    duration = time.monotonic() - t_run
    print(
        f"ivralo vs plain ipykernel, idle memory: {env['cpu_count']} CPUs, Python {env['python']}, "
        f"ipykernel {env['ipykernel']}, load avg {load_before[0]:.2f} -> {load_after[0]:.2f}, {duration:.0f} s\n"
    )
    print("\n".join(lines))
    record = {
        **record_header("idle_rss", started, duration, args, env, (load_before, load_after)),
        "jupyter_folders": folders,
        "summary": report,
        "kernels": [{**k.info, "samples_bytes": k.samples} for k in kernels],
    }
    write_results(args.results_dir, "idle_rss", started, record)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def run_logging_kernels(root: Path) -> int:
        with (root / KERNEL_LOG).open("wb") as kernel_log:
            return run(args, root, kernel_log, log_to_stderr)

    return run_bench("ivralo-bench-rss-", run_logging_kernels)


if __name__ == "__main__":
    sys.exit(main())
