"""Cost of the credential broker, seen from a kernel cell: an API call's round trip, and SQL rows/s.

One guarded worker (``Session(workspace, grants=("bench", "databases"))``) and one loopback HTTP
endpoint (a separate process on 127.0.0.1, HTTP/1.1 keep-alive, answering ``{"n": n}`` as JSON) are
used by both parts, in the same run.

**(a) API call overhead.** ``bench.echo`` is an operation in ``$IVRALO_CONFIG_HOME/apis.json``:
``GET http://127.0.0.1:<port>/echo?n=<n>`` with ``BENCH_API_KEY`` (set in the host only) as a bearer
token; the endpoint answers 401 without it. Inside the kernel a cell times, with
``time.perf_counter_ns()``, in pairs whose order alternates:

* **brokered**: ``ivralo.call("bench.echo", n=n)`` (kernel -> the broker's socket -> host watchdog ->
  broker thread pool -> http.client on a kept connection -> endpoint, and back over the socket);
* **direct**: the same GET (``/plain?n=n``, no key) with ``http.client`` on a kept connection from the
  kernel itself (allowed by ``.ivralo/permissions.json``), i.e. the endpoint's own time plus loopback.

**overhead** = brokered - direct, per pair; p50 and p99 of it are reported (and of both sides). Cells
hold at most 50 calls (the broker allows 100 per execution); untimed warm-up calls come first.
Target (from the issue): overhead <= 5 ms at p50.

**(b) SQL rows/s.** A SQLite file in the workspace with 100,000 rows x 5 columns (int, text, real,
ISO date text, int), named in ``databases.json`` with ``max_rows`` 200,000. A cell times
``ivralo.sql("bench", "select * from items")`` as a list of dicts, and with ``dataframe=True``, and,
for scale, the same query straight from the kernel with ``sqlite3`` (dicts) and
``pandas.read_sql_query``. Trials rotate the order. The breakdown: the host's own query time (the
``seconds`` of the call's record: the fetch, the Arrow batches sized and redacted, the segment
written), and the time until the answer is in the kernel (``BROKER.ask`` straight and the Arrow
table read from the exchange folder, or the rows as lists for a JSON answer; ``ivralo.sql`` then
builds the dicts or the DataFrame). ``bench/hot_path_breakdown.py --sql`` splits it further.

Run: ``.venv/bin/python bench/broker.py`` (``--quick`` for a smoke run). A JSON file with every
sample goes to ``bench/results/broker-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deadline_precision import captured_lines, run_captured_bench
from startup_latency import (
    DEFAULT_RESULTS_DIR,
    environment_info,
    isolate_jupyter,
    percentile,
    record_header,
    summary,
    write_results,
)

if TYPE_CHECKING:
    from harness_api import Context, Metric

TARGET_OVERHEAD_P50_MS = 5.0
CALLS_PER_CELL = 50  # the broker allows 100 brokered calls per execution
SQL_ROWS = 100_000
OPERATION = "bench.echo"
CREDENTIAL = "BENCH_API_KEY"
DB_URL_VAR = "BENCH_DB_URL"
SQL_KINDS = ("broker_dicts", "broker_dataframe", "broker_answer_only", "local_sqlite3_dicts", "local_pandas")

# The endpoint: its own process, so that it does not share the host's GIL. HTTP/1.1 keep-alive;
# ``/echo`` wants the bearer key (the broker's path), ``/plain`` does not (the kernel's direct path).
ENDPOINT = r"""
import http.server, json, sys, time
from urllib.parse import parse_qs, urlsplit
KEY = sys.argv[1]

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stall

    def do_GET(self):
        t0 = time.perf_counter_ns()
        url = urlsplit(self.path)
        if url.path == "/echo" and self.headers.get("Authorization") != "Bearer " + KEY:
            status, body = 401, b'{"error": "no key"}'
        elif url.path in ("/echo", "/plain"):
            n = int(parse_qs(url.query).get("n", ["0"])[0])
            status = 200
            body = json.dumps({"n": n, "handler_us": (time.perf_counter_ns() - t0) / 1000}).encode()
        else:
            status, body = 404, b"{}"
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
print(server.server_address[1], flush=True)
server.serve_forever()
"""

# Run once in the kernel: the timed loops (the results go back as one JSON line).
KERNEL_SETUP = r"""
import http.client, json, time
from ivralo_kernel.kernel.broker_client import BROKER
_conn = http.client.HTTPConnection("127.0.0.1", {port}, timeout=30)

def _direct(n):
    _conn.request("GET", f"/plain?n={{n}}")
    response = _conn.getresponse()
    body = json.loads(response.read())
    assert response.status == 200 and body["n"] == n, (response.status, body)
    return body

def _brokered(n):
    response = ivralo.call("bench.echo", n=n)
    assert response.status == 200 and response.body["n"] == n, response
    return response.body

def _pairs(count, start):
    samples = []
    for i in range(count):
        n = start + i
        times = {{}}
        for kind in (("brokered", "direct") if n % 2 == 0 else ("direct", "brokered")):
            call = _brokered if kind == "brokered" else _direct
            t0 = time.perf_counter_ns()
            body = call(n)
            times[kind] = (time.perf_counter_ns() - t0) / 1e6
            times[kind + "_handler_ms"] = body["handler_us"] / 1000
            if kind == "brokered":  # the host's own time for the call: its GET to the endpoint and back
                times["brokered_host_ms"] = BROKER.records[-1]["seconds"] * 1000
        samples.append(times)
    return samples

def _sql(kind, path, rows):
    query = "select * from items"
    t0 = time.perf_counter_ns()
    if kind == "broker_answer_only":  # the host's answer as it arrives: no dicts, no DataFrame
        from ivralo_kernel.kernel import broker_rows
        from ivralo_kernel.protocol import names
        payload = {{"database": "bench", "query": query, "params": {{}}, "arrow": broker_rows.takes_arrow()}}
        answer = BROKER.ask(names.BROKER_SQL, payload, 300)
        BROKER.records.append(answer["record"])
        arrow = answer["result"].get("arrow")
        n = broker_rows.read_table(arrow).num_rows if arrow else len(answer["result"]["rows"])
    elif kind == "broker_dicts":
        result = ivralo.sql("bench", query)
        n = len(result)
    elif kind == "broker_dataframe":
        result = ivralo.sql("bench", query, dataframe=True)
        n = len(result.index)
    elif kind == "local_sqlite3_dicts":
        import sqlite3
        with sqlite3.connect(path) as db:
            cursor = db.execute(query)
            columns = [c[0] for c in cursor.description]
            result = [dict(zip(columns, row)) for row in cursor]
        db.close()
        n = len(result)
    else:
        import pandas, sqlite3
        with sqlite3.connect(path) as db:
            result = pandas.read_sql_query(query, db)
        db.close()
        n = len(result.index)
    seconds = (time.perf_counter_ns() - t0) / 1e9
    assert n == rows, (kind, n)
    host = BROKER.records[-1]["seconds"] if kind.startswith("broker") else None
    return {{"kind": kind, "s": seconds, "host_query_s": host, "rows": n}}
"""


@contextmanager
def endpoint(key: str) -> Iterator[tuple[int, int]]:
    """The loopback HTTP endpoint in its own process; yields (port, pid)."""
    proc = subprocess.Popen([sys.executable, "-c", ENDPOINT, key], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the port, once it listens
        if not line.strip().isdigit():
            raise RuntimeError(f"the endpoint did not start (exit {proc.poll()})")
        yield int(line), proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def make_sqlite(path: Path, rows: int) -> None:
    with sqlite3.connect(path) as db:
        db.execute("create table items (id integer primary key, name text, price real, created text, quantity integer)")
        db.executemany(
            "insert into items values (?, ?, ?, ?, ?)",
            (
                (i, f"item-{i:06d}", round(i * 0.37 % 1000, 2), f"2026-{1 + i % 12:02d}-{1 + i % 28:02d}", i % 97)
                for i in range(1, rows + 1)
            ),
        )
    db.close()


def prepare(root: Path, port: int, key: str, rows: int) -> Path:
    """The config home's apis.json, and a workspace with permissions.json, databases.json and the DB."""
    config_home = root / "ivralo-config"
    config_home.mkdir()
    os.environ["IVRALO_CONFIG_HOME"] = str(config_home)
    apis = {
        "operations": {
            OPERATION: {
                "url": f"http://127.0.0.1:{port}/echo",
                "credential": CREDENTIAL,
                "auth": {"kind": "bearer"},
                "params": {"n": {"type": "integer"}},
            }
        }
    }
    (config_home / "apis.json").write_text(json.dumps(apis))
    os.environ[CREDENTIAL] = key  # the host's environment; the kernel's is scrubbed of it
    workspace = root / "workspace"
    (workspace / ".ivralo").mkdir(parents=True)
    (workspace / ".ivralo" / "permissions.json").write_text(json.dumps({"hosts": {"allow": [f"127.0.0.1:{port}"]}}))
    db = workspace / "bench.sqlite"
    make_sqlite(db, rows)
    os.environ[DB_URL_VAR] = f"sqlite:///{db}"
    databases = {"bench": {"url_env": DB_URL_VAR, "max_rows": max(200_000, rows), "max_bytes": 256 << 20}}
    (workspace / "databases.json").write_text(json.dumps(databases))
    return workspace


def without_sandbox() -> None:
    """The direct GET needs a direct route, which the OS sandbox does not give (its egress proxy's
    cost is sandbox_cost.py's): the worker runs without it, as the bench did before the sandbox came."""
    settings = Path(os.environ["JUPYTER_CONFIG_DIR"]) / "jupyter_ivralo_config.json"
    settings.write_text(json.dumps({"IvraloSettings": {"sandbox": "off", "landlock_network": True}}), encoding="utf-8")


def output_json(result: object, what: str) -> Any:
    """The JSON a timing cell printed on its first line (the broker's record line follows)."""
    if not isinstance(result, str):
        raise RuntimeError(f"{what} failed: {result!r}"[:3000])
    return json.loads(result.splitlines()[0])


async def measure(
    workspace: Path, port: int, args: argparse.Namespace, log: Callable[[str], None]
) -> tuple[list[dict[str, float]], list[dict[str, Any]], str]:
    from ivralo_kernel.host import Session

    async with Session(workspace=workspace, grants=("bench", "databases")) as session:
        setup = await session.run(KERNEL_SETUP.format(port=port))
        if setup != "":
            raise RuntimeError(f"set-up cell failed: {setup!r}"[:3000])
        check = await session.run("import os\nprint(os.environ.get('BENCH_API_KEY'), os.environ.get('BENCH_DB_URL'))")
        if check != "None None\n":
            raise RuntimeError(f"the kernel sees a credential: {check!r}")

        start = 0
        for _ in range(args.warmup_cells):
            output_json(await session.run(f"print(json.dumps(_pairs({CALLS_PER_CELL}, {start})))"), "warm-up")
            start += CALLS_PER_CELL
        api: list[dict[str, float]] = []
        record_line = ""
        for cell in range(args.cells):
            result = await session.run(f"print(json.dumps(_pairs({CALLS_PER_CELL}, {start})))")
            api += output_json(result, "API cell")
            record_line = str(result).splitlines()[-1]
            start += CALLS_PER_CELL
            last = api[-CALLS_PER_CELL:]
            med = percentile([s["brokered"] - s["direct"] for s in last], 50)
            log(f"  API cell {cell + 1}/{args.cells}: median overhead {med:.2f} ms")

        sql: list[dict[str, Any]] = []
        db = workspace / "bench.sqlite"
        # Untimed: the first of each path imports what it needs (pyarrow, pandas), whichever kind runs first.
        for kind in ("broker_dicts", "broker_dataframe"):
            output_json(await session.run(f"print(json.dumps(_sql({kind!r}, {str(db)!r}, {args.rows})))"), "warm")
        for trial in range(args.sql_trials):
            shift = trial % len(SQL_KINDS)
            for kind in SQL_KINDS[shift:] + SQL_KINDS[:shift]:
                result = await session.run(f"print(json.dumps(_sql({kind!r}, {str(db)!r}, {args.rows})))")
                sql.append(output_json(result, f"SQL {kind}"))
            done = {r["kind"]: r["s"] for r in sql[-len(SQL_KINDS) :]}
            log(f"  SQL trial {trial + 1}/{args.sql_trials}: " + ", ".join(f"{k} {v:.2f}s" for k, v in done.items()))
    return api, sql, record_line


def build_report(api: list[dict[str, float]], sql: list[dict[str, Any]], rows: int) -> tuple[dict[str, Any], list[str]]:
    overhead = [s["brokered"] - s["direct"] for s in api]
    a = {
        "brokered_ms": summary([s["brokered"] for s in api]),
        "direct_ms": summary([s["direct"] for s in api]),
        "overhead_ms": summary(overhead),
        "host_call_ms": summary([s["brokered_host_ms"] for s in api]),
        "transport_ms": summary([s["brokered"] - s["brokered_host_ms"] for s in api]),
        "endpoint_handler_ms": summary([s["brokered_handler_ms"] for s in api] + [s["direct_handler_ms"] for s in api]),
    }
    p50 = float(a["overhead_ms"]["median"])
    target = {"target": TARGET_OVERHEAD_P50_MS, "value": p50, "met": p50 <= TARGET_OVERHEAD_P50_MS}
    lines = [f"(a) {OPERATION} through the broker vs the same GET from the kernel ({len(api)} pairs, ms)"]
    header = f"{'':40}{'p50':>9}{'p99':>9}{'min':>9}{'max':>9}"
    lines += [header, "-" * len(header)]
    for label, key in (
        ("brokered ivralo.call", "brokered_ms"),
        ("direct GET (http.client, kept)", "direct_ms"),
        ("overhead (paired difference)", "overhead_ms"),
        ("  host's HTTP call (record)", "host_call_ms"),
        ("  brokered - host's call", "transport_ms"),
        ("endpoint handler (server side)", "endpoint_handler_ms"),
    ):
        s = a[key]
        lines.append(f"{label:40}{s['median']:9.2f}{s['p99']:9.2f}{s['min']:9.2f}{s['max']:9.2f}")
    verdict = "MET" if target["met"] else "MISSED"
    lines.append(f"overhead p50 {p50:.2f} ms (target <= {TARGET_OVERHEAD_P50_MS} ms: {verdict})")

    b: dict[str, Any] = {}
    lines += ["", f"(b) select * of {rows} rows x 5 columns (SQLite), per trial"]
    header = f"{'':40}{'median s':>10}{'rows/s':>12}{'max s':>9}{'host query s':>14}"
    lines += [header, "-" * len(header)]
    labels = {
        "broker_dicts": "ivralo.sql -> list of dicts",
        "broker_dataframe": "ivralo.sql(dataframe=True)",
        "broker_answer_only": "  of which: the answer (Arrow read, or lists)",
        "local_sqlite3_dicts": "local sqlite3 -> dicts (scale)",
        "local_pandas": "local pandas.read_sql_query",
    }
    for kind in SQL_KINDS:
        runs = [r for r in sql if r["kind"] == kind]
        seconds = [float(r["s"]) for r in runs]
        host = [float(r["host_query_s"]) for r in runs if r["host_query_s"] is not None]
        med = percentile(seconds, 50)
        b[kind] = {"seconds": summary(seconds), "rows_per_s_median": rows / med, "host_query_s": summary(host)}
        host_col = f"{percentile(host, 50):14.2f}" if host else f"{'-':>14}"
        lines.append(f"{labels[kind]:40}{med:10.2f}{rows / med:12,.0f}{max(seconds):9.2f}{host_col}")
    return {"api": a, "sql": b, "target_overhead_p50": target}, lines


def harness(ctx: Context) -> list[Metric]:
    """The brokered call against the direct GET (paired as the cell pairs them), and ivralo.sql against
    the same query read in the kernel (paired by trial)."""
    from harness_api import Metric

    smoke = ["--cells", "1", "--warmup-cells", "0", "--sql-trials", "1", "--rows", "2000"]
    args = parse_args(smoke if ctx.smoke else ["--sql-trials", "4"])
    key = f"bench-{secrets.token_hex(16)}"
    without_sandbox()
    ctx.notes.append("the worker runs without the OS sandbox (the direct GET needs a direct route)")
    with endpoint(key) as (port, _pid):
        workspace = prepare(ctx.root, port, key, args.rows)
        api, sql, _record = asyncio.run(measure(workspace, port, args, ctx.log))

    def seconds(kind: str) -> list[float]:
        return [float(r["s"]) * 1000 for r in sql if r["kind"] == kind]

    rows = f"{args.rows:,} rows x 5 columns"
    direct = "direct GET from the kernel"
    return [
        Metric(
            "broker",
            "ivralo.call of a loopback API",
            "ms",
            [s["brokered"] for s in api],
            [s["direct"] for s in api],
            baseline_label=direct,
        ),
        Metric(
            "broker",
            f"ivralo.sql, {rows} -> dicts",
            "ms",
            seconds("broker_dicts"),
            seconds("local_sqlite3_dicts"),
            baseline_label="sqlite3 in the kernel",
        ),
        Metric(
            "broker",
            f"ivralo.sql(dataframe=True), {rows}",
            "ms",
            seconds("broker_dataframe"),
            seconds("local_pandas"),
            baseline_label="pandas.read_sql_query in the kernel",
        ),
    ]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cells", type=int, default=10, help=f"timed API cells of {CALLS_PER_CELL} pairs (default 10)")
    p.add_argument("--warmup-cells", type=int, default=1, help="untimed API cells first (default 1)")
    p.add_argument("--sql-trials", type=int, default=5, help="timed runs of each SQL kind (default 5)")
    p.add_argument("--rows", type=int, default=SQL_ROWS, help=f"rows in the SQLite table (default {SQL_ROWS})")
    p.add_argument("--quick", action="store_true", help="smoke mode: 2 API cells, 2 SQL trials")
    p.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR, help="where the JSON file goes")
    p.add_argument("--strict", action="store_true", help="exit 1 when the overhead target is missed")
    args = p.parse_args(argv)
    if args.quick:
        args.cells, args.sql_trials = 2, 2
    if args.cells < 1 or args.sql_trials < 1 or args.rows < 1:
        p.error("--cells, --sql-trials and --rows must be at least 1")
    return args


def run(args: argparse.Namespace, root: Path, log: Callable[[str], None], captured: Path) -> int:
    started = datetime.now(UTC)
    folders = isolate_jupyter(root)
    without_sandbox()
    key = f"bench-{secrets.token_hex(16)}"
    load_before = os.getloadavg()
    t_run = time.monotonic()
    with endpoint(key) as (port, endpoint_pid):
        log(f"endpoint on 127.0.0.1:{port} (pid {endpoint_pid}); making {args.rows} rows")
        workspace = prepare(root, port, key, args.rows)
        log(f"API: {args.warmup_cells} warm-up + {args.cells} timed cells of {CALLS_PER_CELL} pairs")
        api, sql, record_line = asyncio.run(measure(workspace, port, args, log))
    report, lines = build_report(api, sql, args.rows)
    env = environment_info()
    load_after = os.getloadavg()
    duration = time.monotonic() - t_run
    print(
        f"ivralo credential broker: {env['cpu_count']} CPUs, Python {env['python']}, "
        f"load avg {load_before[0]:.2f} -> {load_after[0]:.2f}, {duration:.0f} s\n"
    )
    print("\n".join(lines))
    print(f"\nlast API cell's record line: {record_line}")
    record = {
        **record_header("broker", started, duration, args, env, (load_before, load_after)),
        "jupyter_folders": folders,
        "summary": report,
        "record_line": record_line,
        "samples": {"api": api, "sql": sql},
        "captured_stderr": captured_lines(captured)[:200],
    }
    write_results(args.results_dir, "broker", started, record)
    return 1 if (args.strict and not report["target_overhead_p50"]["met"]) else 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_captured_bench("ivralo-bench-broker-", lambda root, log, captured: run(args, root, log, captured))


if __name__ == "__main__":
    sys.exit(main())
