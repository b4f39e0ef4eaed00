"""Added latency of the network guard on an allowed connect: ivralo vs plain ipykernel, in the same run.

One kernel of each kind (``ivralo`` kernelspec vs ipykernel's ``python3``) is started by the same
``jupyter_client.KernelManager`` in a workspace whose ``.ivralo/permissions.json`` allows exactly
``127.0.0.1:<port>`` and ``localhost:<port>``, where ``<port>`` is a TCP server on loopback that this
script runs (a thread accepting and closing connections). Inside each kernel a cell times, with
``time.perf_counter_ns()``:

* **connect**: ``socket.socket()`` + ``connect(("127.0.0.1", port))`` + ``close()``, N times
  (default 500), after untimed warm-up connects (so the guard's decision for the worker is cached;
  the worker's first, uncached decision asks the host, and is timed once in the set-up cell);
* **getaddrinfo**: ``socket.getaddrinfo("localhost", port)``, M times (default 200), also after a
  warm-up (resolved from /etc/hosts; the guard judges the name, cached after the first time).

Before any timing, a set-up cell in each kernel checks the guard is on (ivralo) or absent (plain):
a connect to a loopback port that is *not* allowed must be refused by the guard in ivralo, and must
reach the socket layer (connection refused) in plain. After that set-up ``localhost`` has been
judged, so 127.0.0.1 is a learned address of an allowed name: timed connects take the guard's
learned-address path, the path of ``requests.get("http://localhost:port/")``; both it and the
decision-cache path of a raw IP literal are a dict look-up in the audit hook.

Interleaved rounds (default 7): each round runs the cell once in each kernel, the order alternating
(plain ivralo, ivralo plain, ...). Each round gives a median and a p99 per kind; reported are the
medians over rounds of those, and the **added latency** = ivralo - plain of the medians, in ms.
Target (from the issue): added latency of an allowed connect <= 1 ms at p50.

Run: ``.venv/bin/python bench/network_guard.py`` (``--quick`` for a smoke run). A JSON file with
every sample goes to ``bench/results/network_guard-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import threading
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
    install_spec_with,
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
    from harness_api import Context, Metric
    from jupyter_client.blocking.client import BlockingKernelClient
    from jupyter_client.manager import KernelManager

TARGET_ADDED_P50_MS = 1.0  # from the issue: ivralo - plain, median connect
MARKER = "NETWORK-GUARD-BENCH "
OPS = ("connect", "getaddrinfo")
GUARD_REFUSAL = "ivralo network guard"

# Set-up, once per kernel, untimed by the rounds: the first allowed connect of the worker (the guard
# asks the host: not cached yet) and the second (cached); then is the guard on? A loopback port not in
# hosts.allow must be refused by the guard (ivralo) or reach the socket layer (plain); last, the first
# lookup of the allowed name.
SETUP_CELL = """\
import json, socket, time
def _setup_connect(port):
    t0 = time.perf_counter_ns()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.connect(("127.0.0.1", port))
    finally:
        s.close()
    return time.perf_counter_ns() - t0
_setup = {{"first_connect_ns": _setup_connect({port}), "second_connect_ns": _setup_connect({port})}}
try:
    _setup_connect({closed_port})
    _setup["closed_port"] = "connected"
except socket.gaierror as exc:
    _setup["closed_port"] = "guard" if {refusal!r} in str(exc) else f"gaierror: {{exc}}"
except OSError as exc:
    _setup["closed_port"] = f"os: {{type(exc).__name__}}"
t0 = time.perf_counter_ns()
socket.getaddrinfo("localhost", {port})
_setup["first_lookup_ns"] = time.perf_counter_ns() - t0
print({marker!r} + json.dumps(_setup))
del _setup, _setup_connect
"""

# The timed cell: only the operation is inside the perf_counter_ns pair; results as one JSON line.
TIMED_CELL = """\
import json, socket, time
def _bench_connect():
    t0 = time.perf_counter_ns()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.connect(("127.0.0.1", {port}))
    s.close()
    return time.perf_counter_ns() - t0
def _bench_lookup():
    t0 = time.perf_counter_ns()
    socket.getaddrinfo("localhost", {port})
    return time.perf_counter_ns() - t0
_bench = {{}}
for _ in range({warmup}):
    _bench_connect(); _bench_lookup()
_bench["connect"] = [_bench_connect() for _ in range({n})]
_bench["getaddrinfo"] = [_bench_lookup() for _ in range({m})]
print({marker!r} + json.dumps(_bench))
del _bench, _bench_connect, _bench_lookup
"""


# --------------------------------------------------------------------------- loopback server


class LoopbackServer:
    """A TCP server on 127.0.0.1 that accepts and closes every connection (on a daemon thread)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.port = int(self.sock.getsockname()[1])
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, name="loopback-server", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            conn.close()
            self.accepted += 1

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        self.sock.close()
        self._thread.join(timeout=5)


def closed_loopback_port() -> int:
    """A port nothing listens on (bound, never listened, released: connect gets ECONNREFUSED)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --------------------------------------------------------------------------- kernels


def run_cell(kc: BlockingKernelClient, code: str, timeout: float) -> tuple[dict[str, Any], str]:
    """Execute ``code`` (no stdin: nobody is asked); return its marked JSON line and all its stdout."""
    msg_id = kc.execute(code, allow_stdin=False)
    reply = await_reply(kc, msg_id, timeout)
    if reply["content"]["status"] != "ok":
        content = reply["content"]
        raise RuntimeError(f"cell failed: {content.get('ename')}: {content.get('evalue')}")
    stdout: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"no status: idle within {timeout} s")
        msg: dict[str, Any] = kc.get_iopub_msg(timeout=remaining)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            stdout.append(msg["content"]["text"])
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    text = "".join(stdout)
    marked = [line[len(MARKER) :] for line in text.splitlines() if line.startswith(MARKER)]
    if len(marked) != 1:
        raise RuntimeError(f"expected one result line, got:\n{text[-2000:]}")
    return json.loads(marked[0]), text


def ms(values_ns: list[int]) -> list[float]:
    return [v / 1e6 for v in values_ns]


def round_stats(record: dict[str, Any]) -> dict[str, dict[str, float]]:
    return {op: {"median": percentile(ms(record[op]), 50), "p99": percentile(ms(record[op]), 99)} for op in OPS}


# --------------------------------------------------------------------------- run


def measure(
    bench: Bench, server: LoopbackServer, closed_port: int, args: argparse.Namespace, log: Callable[[str], None]
) -> dict[str, Any]:
    managers: dict[str, KernelManager] = {}
    clients: dict[str, BlockingKernelClient] = {}
    rounds: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
    setup: dict[str, Any] = {}
    layers: dict[str, Any] = {}
    try:
        for kind in KINDS:
            managers[kind] = bench.new_manager(kind)
            clients[kind], _ = bench.start(managers[kind])
        # Which layers the ivralo kernel has in force (the network guard, the Landlock TCP floor).
        info = await_reply(clients[IVRALO], clients[IVRALO].kernel_info(), args.timeout)["content"]
        layers.update((info.get("ivralo") or {}).get("layers") or {})
        log(f"  ivralo layers: {', '.join(f'{k}: {v}' for k, v in layers.items() if 'network' in k or 'tcp' in k)}")
        for kind in KINDS:
            code = SETUP_CELL.format(closed_port=closed_port, port=server.port, refusal=GUARD_REFUSAL, marker=MARKER)
            result, text = run_cell(clients[kind], code, args.timeout)
            setup[kind] = {**result, "output": text}
        expected = {IVRALO: "guard", PLAIN: "os: ConnectionRefusedError"}
        for kind in KINDS:
            if setup[kind]["closed_port"] != expected[kind]:
                raise RuntimeError(
                    f"{kind}: a connect to a port not in hosts.allow gave {setup[kind]['closed_port']!r}, "
                    f"expected {expected[kind]!r}:\n{setup[kind]['output']}"
                )
        log(f"  guard check: ivralo refuses port {closed_port} (not allowed), plain reaches the socket layer")
        timed = TIMED_CELL.format(port=server.port, n=args.connects, m=args.lookups, warmup=args.warmup, marker=MARKER)
        for i, order in pairs(args.rounds):
            for kind in order:
                record, text = run_cell(clients[kind], timed, args.timeout)
                if kind == IVRALO and "[ivralo network:" not in text and i == 0:
                    raise RuntimeError(f"ivralo printed no hosts-tried line; is the guard on?\n{text[-1000:]}")
                record["hosts_tried_line"] = next((ln for ln in text.splitlines() if ln.startswith("[ivralo")), None)
                rounds[kind].append(record)
            us = {kind: round_stats(rounds[kind][-1])["connect"]["median"] * 1000 for kind in KINDS}
            log(f"  round {i + 1}/{args.rounds}: connect median plain {us[PLAIN]:.1f} us, ivralo {us[IVRALO]:.1f} us")
    finally:
        for kind, km in managers.items():
            shutdown(km, clients.get(kind))
    return {"setup": setup, "rounds": rounds, "ivralo_layers": layers}


def build_report(rounds: dict[str, list[dict[str, Any]]], setup: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    per_round = {kind: [round_stats(r) for r in rounds[kind]] for kind in KINDS}
    summary: dict[str, Any] = {}
    for op in OPS:
        summary[op] = {}
        for kind in KINDS:
            pooled = [v for r in rounds[kind] for v in ms(r[op])]
            summary[op][kind] = {
                "median_of_round_medians_ms": statistics.median(s[op]["median"] for s in per_round[kind]),
                "median_of_round_p99s_ms": statistics.median(s[op]["p99"] for s in per_round[kind]),
                "pooled_median_ms": percentile(pooled, 50),
                "pooled_p99_ms": percentile(pooled, 99),
                "n": len(pooled),
            }
        for key in ("median_of_round_medians_ms", "median_of_round_p99s_ms"):
            summary[op][f"added_{key}"] = summary[op][IVRALO][key] - summary[op][PLAIN][key]
        summary[op]["added_per_round_median_ms"] = [
            a[op]["median"] - b[op]["median"] for a, b in zip(per_round[IVRALO], per_round[PLAIN], strict=True)
        ]
    once = {
        key: {kind: setup[kind][f"{key}_ns"] / 1e6 for kind in KINDS}
        for key in ("first_connect", "second_connect", "first_lookup")
    }
    summary["set_up_single_shots_ms"] = once
    added = summary["connect"]["added_median_of_round_medians_ms"]
    target = {"target_ms": TARGET_ADDED_P50_MS, "value_ms": added, "met": bool(added <= TARGET_ADDED_P50_MS)}
    summary["target_added_connect_p50"] = target

    n_rounds = len(rounds[PLAIN])
    lines = [
        f"per operation, ms; median over {n_rounds} interleaved rounds of each round's median / p99",
        f"{'':36}{'plain':>10}{'ivralo':>10}{'added':>10}",
        "-" * 66,
    ]
    for op, label in (("connect", "connect (socket+connect+close)"), ("getaddrinfo", "getaddrinfo localhost")):
        s = summary[op]
        for q, key in (("p50", "median_of_round_medians_ms"), ("p99", "median_of_round_p99s_ms")):
            lines.append(f"{label + ' ' + q:36}{s[PLAIN][key]:10.4f}{s[IVRALO][key]:10.4f}{s['added_' + key]:+10.4f}")
    lines.append("")
    lines.append(
        "added per round (connect p50, ms): "
        + ", ".join(f"{v:+.4f}" for v in summary["connect"]["added_per_round_median_ms"])
    )
    lines.append("single shots in the set-up cell, ms (plain / ivralo):")
    for key, label in (
        ("first_connect", "first connect of the worker (not cached: ivralo asks the host)"),
        ("second_connect", "second connect (cached)"),
        ("first_lookup", "first getaddrinfo localhost (not cached)"),
    ):
        lines.append(f"  {label:64}{once[key][PLAIN]:8.3f} / {once[key][IVRALO]:.3f}")
    verdict = "MET" if target["met"] else "MISSED"
    lines.append(f"added connect latency p50: {added:.4f} ms (target <= {TARGET_ADDED_P50_MS} ms: {verdict})")
    return summary, lines


def harness(ctx: Context) -> list[Metric]:
    """Allowed connects and lookups in both kinds, timed in the kernels; sample j of a round's ivralo
    cell is paired with sample j of the same round's plain cell (the two cells ran back to back)."""
    from harness_api import Metric

    argv = ["--rounds", "2", "--connects", "50", "--lookups", "20", "--warmup", "5"] if ctx.smoke else []
    args = parse_args(argv)
    workspace = ctx.root / "workspace"
    (workspace / ".ivralo").mkdir(parents=True)
    server = LoopbackServer()
    try:
        allowed = [f"127.0.0.1:{server.port}", f"localhost:{server.port}"]
        (workspace / ".ivralo" / "permissions.json").write_text(json.dumps({"hosts": {"allow": allowed}}))
        bench = Bench(workspace, Path(os.environ["JUPYTER_RUNTIME_DIR"]), ctx.kernel_log, args.timeout)
        # The audit hook's cost on a direct connect: in the OS sandbox there is no direct route (the
        # egress proxy's cost is sandbox_cost.py's), so this ivralo kernel runs without it.
        bench.kernel_names[IVRALO] = install_spec_with("ivralo-nosandbox", sandbox="off", landlock_network=True)
        data = measure(bench, server, closed_loopback_port(), args, ctx.log)
    finally:
        server.close()
    rounds = data["rounds"]

    def pooled(kind: str, op: str) -> list[float]:
        return [v * 1000 for r in rounds[kind] for v in ms(r[op])]

    return [
        Metric(
            "network guard",
            "allowed connect (socket+connect+close)",
            "us",
            pooled(IVRALO, "connect"),
            pooled(PLAIN, "connect"),
        ),
        Metric(
            "network guard",
            "getaddrinfo of an allowed name",
            "us",
            pooled(IVRALO, "getaddrinfo"),
            pooled(PLAIN, "getaddrinfo"),
        ),
    ]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds, one cell per kind each (default 7)")
    p.add_argument("--connects", type=int, default=500, help="timed connects per cell (default 500)")
    p.add_argument("--lookups", type=int, default=200, help="timed getaddrinfo calls per cell (default 200)")
    p.add_argument("--warmup", type=int, default=20, help="untimed connects and lookups per cell first (default 20)")
    p.add_argument("--quick", action="store_true", help="smoke mode: 2 rounds of 100 connects and 50 lookups")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds for a kernel start or a cell (default 60)")
    p.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR, help="where the JSON file goes")
    p.add_argument("--strict", action="store_true", help="exit 1 when the target is missed")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.connects, args.lookups = 2, 100, 50
    if min(args.rounds, args.connects, args.lookups) < 1 or args.warmup < 1:
        p.error("--rounds, --connects, --lookups and --warmup must be at least 1")
    return args


def run(args: argparse.Namespace, root: Path, kernel_log: IO[bytes], log: Callable[[str], None]) -> int:
    started = datetime.now(UTC)
    folders = isolate_jupyter(root)
    workspace = root / "workspace"
    (workspace / ".ivralo").mkdir(parents=True)
    server = LoopbackServer()
    try:
        allowed = [f"127.0.0.1:{server.port}", f"localhost:{server.port}"]
        (workspace / ".ivralo" / "permissions.json").write_text(json.dumps({"hosts": {"allow": allowed}}))
        bench = Bench(workspace, Path(folders["JUPYTER_RUNTIME_DIR"]), kernel_log, args.timeout)
        # see harness(): direct links to the allowed hosts (landlock_network), as the fallback needs for them
        bench.kernel_names[IVRALO] = install_spec_with("ivralo-nosandbox", sandbox="off", landlock_network=True)
        load_before = os.getloadavg()
        t_run = time.monotonic()
        log(f"{args.rounds} interleaved rounds of {args.connects} connects + {args.lookups} lookups per kind")
        data = measure(bench, server, closed_loopback_port(), args, log)
        accepted = server.accepted
    finally:
        server.close()
    summary, lines = build_report(data["rounds"], data["setup"])
    env = environment_info()
    load_after = os.getloadavg()
    print(
        f"network guard, ivralo vs plain ipykernel: {env['cpu_count']} CPUs, Python {env['python']}, "
        f"ipykernel {env['ipykernel']}, load avg {load_before[0]:.2f} -> {load_after[0]:.2f}\n"
    )
    print("\n".join(lines))
    record = {
        **record_header("network_guard", started, time.monotonic() - t_run, args, env, (load_before, load_after)),
        "jupyter_folders": folders,
        "hosts_allow": allowed,
        "server_accepted": accepted,
        "ivralo_layers": data["ivralo_layers"],
        "setup": data["setup"],
        "summary": summary,
        "samples_ns": data["rounds"],
    }
    write_results(args.results_dir, "network_guard", started, record)
    return 1 if (args.strict and not summary["target_added_connect_p50"]["met"]) else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def run_logging_kernels(root: Path) -> int:
        with (root / KERNEL_LOG).open("wb") as kernel_log:
            return run(args, root, kernel_log, log_to_stderr)

    return run_bench("ivralo-bench-", run_logging_kernels)


if __name__ == "__main__":
    sys.exit(main())
