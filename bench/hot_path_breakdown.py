"""Where a proxied GET and an ``ivralo.call`` spend their time: marks on one clock (CLOCK_MONOTONIC,
shared by the kernel's process and the host's), medians over many requests, each relative to the
request's start in the cell.

``--proxy``: a sandboxed kernel GETs from a loopback server (its own process) in a loop, through the
sandbox's relay and the host's egress proxy; marks from the cell (``c_*``: urllib's connect, send,
response) and from the host's proxy (``h_*``: accepted, head read, decided, connected upstream,
splice), and the host's calls timed alone (``*_us``: the allow list, the runtime folder's ports).
``--broker``: ``ivralo.call`` of a loopback API (the broker bench's endpoint, no sandbox); marks
from the kernel (``k_*``: the request written on the broker's socket, the answer delivered by its
reader thread) and from the host (``h_*``: the watchdog's receipt, the call's thread, the HTTP call,
the answer sent).
``--sql``: ``ivralo.sql`` of the broker bench's 100,000 rows x 5 columns, as dicts and with
``dataframe=True`` (``--rows`` to change); marks from the kernel (``k_*``: publish, answer delivered,
the Arrow segment read, the dicts or the DataFrame built) and from the host (``h_*``: receipt, the
call's thread, the query's start and end, the Arrow segment written, the answer sent), and the
host's time in its parts (``*_us``: building and redacting the Arrow batches, making the table).

Diagnostic only (it wraps the host's functions in this process); ``make bench`` does not run it.
Run: ``.venv/bin/python bench/hot_path_breakdown.py --proxy`` (or ``--broker``, ``--sql``), ~10 s each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

T = time.monotonic_ns
Marks = list[tuple[str, int]]


def wrap(owner: Any, name: str, before: Callable[[tuple[Any, ...]], None] | None, after: Callable[[Any], None]) -> None:
    original = getattr(owner, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if before is not None:
            before(args)
        result = original(*args, **kwargs)
        after(args)
        return result

    setattr(owner, name, wrapped)


def report(rows: list[dict[str, float]]) -> None:
    keys = {k for r in rows for k in r}
    marks = sorted(
        (k for k in keys if not k.endswith("_us")), key=lambda k: statistics.median(r[k] for r in rows if k in r)
    )
    for k in marks + sorted(k for k in keys if k.endswith("_us")):
        values = [r[k] for r in rows if k in r]
        print(f"{k:26} {statistics.median(values):9.1f} us  (n={len(values)})")


PROXY_CELL = """
import json, time, urllib.request as u, http.client
T = time.monotonic_ns
_m = {{}}
_c, _g = http.client.HTTPConnection.connect, http.client.HTTPConnection.getresponse
def _connect(self):
    _m['c_connect'] = T(); _c(self); _m['c_connected'] = T()
def _getresponse(self):
    _m['c_sent'] = T(); r = _g(self); _m['c_response'] = T(); return r
http.client.HTTPConnection.connect, http.client.HTTPConnection.getresponse = _connect, _getresponse
_t = []
for _ in range({n}):
    _m.clear(); _s = T()
    u.urlopen('http://127.0.0.1:{port}/', timeout=10).read()
    _t.append((_s, T(), dict(_m)))
http.client.HTTPConnection.connect, http.client.HTTPConnection.getresponse = _c, _g
print(json.dumps(_t))
"""


async def proxy(n: int) -> list[dict[str, float]]:
    sys.path.insert(0, str(Path(__file__).parent))
    import sandbox_cost

    from ivralo_kernel.host.jupyter import egress_gate
    from ivralo_kernel.host.sandbox import egress, egress_proxy

    requests: list[Marks] = []

    def mark(label: str) -> Callable[[Any], None]:
        return lambda _args: requests[-1].append((label, T())) if requests else None

    wrap(egress_proxy, "handed_over", lambda _a: requests.append([("h_accepted", T())]), mark("h_handed_over"))
    wrap(egress_proxy, "read_head", None, mark("h_head"))
    wrap(egress_gate.EgressGate, "decide", None, mark("h_decided"))
    wrap(egress_proxy, "_connect", mark("h_resolved"), mark("h_connected"))
    wrap(egress_proxy, "splice", mark("h_splice"), mark("h_end"))
    for owner, name in (
        (egress.EgressDesk, "policy"),
        (egress_gate.EgressGate, "_runtime_ports"),
        (egress_gate.EgressGate, "closed_peer"),
    ):
        started: list[int] = []
        wrap(
            owner,
            name,
            lambda _a, s=started: s.append(T()),
            lambda _a, s=started, n=name: requests[-1].append((f"{n}_us", T() - s.pop())) if requests else None,
        )

    server = subprocess.Popen(
        [sys.executable, "-c", sandbox_cost.ANSWER_SERVER, "0"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        km, kc = await sandbox_cost.start("ivralo-sandbox", port, Path(tempfile.mkdtemp(prefix="ivralo-breakdown-")))
        try:
            await sandbox_cost.run_until_idle(
                kc, f"import urllib.request as u\nu.urlopen('http://127.0.0.1:{port}/').read()"
            )
            requests.clear()
            out: list[str] = []
            keep = lambda msg: out.append(msg["content"]["text"]) if msg["msg_type"] == "stream" else None  # noqa: E731
            await kc.execute_interactive(PROXY_CELL.format(n=n, port=port), timeout=120, output_hook=keep)
        finally:
            kc.stop_channels()
            await km.shutdown_kernel(now=True)
    finally:
        server.kill()
        server.wait()
    cell = json.loads(next(line for line in "".join(out).splitlines() if line.startswith("[[")))
    rows = []
    for (start, end, marks), host in zip(cell, requests, strict=False):
        row = {k: (v - start) / 1000 for k, v in [*host, *marks.items()] if not k.endswith("_us")}
        row |= {k: v / 1000 for k, v in host if k.endswith("_us")}
        rows.append(row | {"c_done": (end - start) / 1000})
    return rows


BROKER_CELL = """
import json, time, ivralo
from ivralo_kernel.kernel.broker_client import BROKER
T = time.monotonic_ns
_k = []
_send, _deliver = BROKER._send, BROKER.deliver
def _pub(sock, request):
    _k[-1].update(rid=request["req_id"], k_publish=T()); _send(sock, request); _k[-1]["k_published"] = T()
def _del(content):
    _k[-1]["k_delivered"] = T(); _deliver(content)
BROKER._send, BROKER.deliver = _pub, _del
for i in range({n}):
    _k.append({{"k_start": T()}}); ivralo.call("bench.echo", n=i); _k[-1]["k_done"] = T()
BROKER._send, BROKER.deliver = _send, _deliver
print(json.dumps(_k))
"""


def broker(n: int) -> list[dict[str, float]]:
    sys.path.insert(0, str(Path(__file__).parent))
    import broker as bench
    from startup_latency import isolate_jupyter

    from ivralo_kernel.host.broker import responder
    from ivralo_kernel.host.watch import broker_link, broker_socket

    marks: dict[str, Marks] = {}
    current: list[str] = []

    def received(args: tuple[Any, ...]) -> None:
        rid = str(args[1].get("req_id"))
        current[:] = [rid]
        marks.setdefault(rid, []).append(("h_received", T()))

    wrap(broker_link.BrokerLink, "_answer", received, lambda _a: None)
    original_run = responder.BrokerResponder._run

    def run(self: Any, job: Any, what: str, credential: str, reply: Any, rid: list[str] = current) -> None:
        mine = marks[rid[0]] if rid else []
        mine.append(("h_call_thread", T()))

        def timed() -> Any:
            mine.append(("h_http_start", T()))
            result = job()
            mine.append(("h_http_done", T()))
            return result

        original_run(self, timed, what, credential, reply)

    responder.BrokerResponder._run = run  # type: ignore[method-assign]

    def sent(args: tuple[Any, ...]) -> None:
        marks.setdefault(str(args[1].get("req_id")), []).append(("h_answer_sent", T()))

    wrap(broker_socket.BrokerSocket, "send", sent, lambda _a: None)
    root = Path(tempfile.mkdtemp(prefix="ivralo-breakdown-"))
    isolate_jupyter(root)
    bench.without_sandbox()
    key = f"bench-{secrets.token_hex(16)}"

    async def cells(workspace: Path) -> str:
        from ivralo_kernel.host import Session

        async with Session(workspace=workspace, grants=("bench", "databases")) as session:
            await session.run("import ivralo\nivralo.call('bench.echo', n=1)")
            return str(await session.run(BROKER_CELL.format(n=n)))

    with bench.endpoint(key) as (port, _pid):
        out = asyncio.run(cells(bench.prepare(root, port, key, 10)))
    rows = []
    for k in json.loads(out.splitlines()[0])[5:]:
        start = k["k_start"]
        row = {name: (v - start) / 1000 for name, v in k.items() if name.startswith("k_")}
        rows.append(row | {name: (v - start) / 1000 for name, v in marks.get(k["rid"], [])})
    return rows


SQL_CELL = """
import json, time, ivralo
from ivralo_kernel.kernel import broker_rows
from ivralo_kernel.kernel.broker_client import BROKER
T = time.monotonic_ns
_k = []
_send, _deliver, _read = BROKER._send, BROKER.deliver, broker_rows.read_table
def _pub(sock, request):
    _k[-1].update(rid=request["req_id"], k_publish=T()); _send(sock, request); _k[-1]["k_published"] = T()
def _del(content):
    _k[-1]["k_delivered"] = T(); _deliver(content)
def _rd(arrow):
    _k[-1]["k_read_start"] = T(); table = _read(arrow); _k[-1]["k_read"] = T(); return table
BROKER._send, BROKER.deliver, broker_rows.read_table = _pub, _del, _rd
for i in range({n}):
    _k.append({{"k_start": T(), "frame": i % 2}})
    ivralo.sql("bench", "select * from items", dataframe=bool(i % 2))
    _k[-1]["k_done"] = T()
BROKER._send, BROKER.deliver, broker_rows.read_table = _send, _deliver, _read
print(json.dumps(_k))
"""


def sql(
    n: int, rows_in_table: int, arrow_min_rows: int | None
) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """(the dicts' marks, the DataFrames' marks), alternating in one cell. ``arrow_min_rows``: the
    host's threshold for an Arrow answer, instead of ``databases.ARROW_MIN_ROWS`` (where JSON and
    Arrow cross: compare a small table with 0 and with one above its rows)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import broker as bench
    from startup_latency import isolate_jupyter

    from ivralo_kernel.host.broker import arrow_rows, databases, responder, result_segments
    from ivralo_kernel.host.watch import broker_link, broker_socket

    if arrow_min_rows is not None:
        databases.ARROW_MIN_ROWS, databases.ARROW_MIN_BYTES = arrow_min_rows, 0 if arrow_min_rows == 0 else 1 << 40
    marks: dict[str, Marks] = {}
    current: list[str] = []

    def received(args: tuple[Any, ...]) -> None:
        rid = str(args[1].get("req_id"))
        current[:] = [rid]
        marks.setdefault(rid, []).append(("h_received", T()))

    def mark(label: str) -> Callable[[Any], None]:
        return lambda _args: marks[current[0]].append((label, T())) if current else None

    wrap(broker_link.BrokerLink, "_answer", received, lambda _a: None)
    wrap(responder.BrokerResponder, "_run", mark("h_call_thread"), lambda _a: None)
    wrap(databases.Databases, "_run", mark("h_query_start"), mark("h_query_done"))
    wrap(result_segments.ResultSegments, "write", None, mark("h_segment_written"))
    for owner, name in ((arrow_rows.ArrowRows, "add"), (arrow_rows.ArrowRows, "table")):
        started: list[int] = []

        def add_time(_a: Any, s: list[int] = started, n: str = name) -> None:
            if current:
                mine = marks[current[0]]
                total = dict(mine).get(f"h_arrow_{n}_us", 0)
                mine[:] = [m for m in mine if m[0] != f"h_arrow_{n}_us"] + [(f"h_arrow_{n}_us", total + T() - s.pop())]

        wrap(owner, name, lambda _a, s=started: s.append(T()), add_time)

    def sent(args: tuple[Any, ...]) -> None:
        marks.setdefault(str(args[1].get("req_id")), []).append(("h_answer_sent", T()))

    wrap(broker_socket.BrokerSocket, "send", sent, lambda _a: None)
    root = Path(tempfile.mkdtemp(prefix="ivralo-breakdown-"))
    isolate_jupyter(root)
    bench.without_sandbox()
    key = f"bench-{secrets.token_hex(16)}"

    async def cells(workspace: Path) -> str:
        from ivralo_kernel.host import Session

        async with Session(workspace=workspace, grants=("bench", "databases")) as session:
            warm = "import ivralo\nivralo.sql('bench', 'select * from items')\n"
            await session.run(warm + "ivralo.sql('bench', 'select * from items', dataframe=True)")
            return str(await session.run(SQL_CELL.format(n=n)))

    with bench.endpoint(key) as (port, _pid):
        out = asyncio.run(cells(bench.prepare(root, port, key, rows_in_table)))
    both: tuple[list[dict[str, float]], list[dict[str, float]]] = ([], [])
    for k in json.loads(out.splitlines()[0]):
        start = k["k_start"]
        row = {name: (v - start) / 1000 for name, v in k.items() if name.startswith("k_")}
        for name, v in marks.get(k["rid"], []):
            row[name] = v / 1000 if name.endswith("_us") else (v - start) / 1000
        both[int(k["frame"])].append(row)
    return both


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--proxy", action="store_true")
    p.add_argument("--broker", action="store_true")
    p.add_argument("--sql", action="store_true")
    p.add_argument("--rows", type=int, default=100_000, help="--sql: rows in the table (default 100,000)")
    p.add_argument("--arrow-min-rows", type=int, help="--sql: the host's threshold for an Arrow answer")
    p.add_argument("-n", type=int, default=100, help="requests (default 100; the broker: at most 95 per cell)")
    args = p.parse_args()
    if args.sql:
        dicts, frames = sql(args.n if args.rows < 10_000 else min(args.n, 20), args.rows, args.arrow_min_rows)
        print(f"ivralo.sql of {args.rows:,} rows x 5 columns -> dicts (us from the call's start)")
        report(dicts)
        print("ivralo.sql(dataframe=True), the same rows (us from the call's start)")
        report(frames)
        return
    if args.proxy or not args.broker:
        print("egress proxy: an allowed GET in a loop, sandboxed kernel (us from the request's start)")
        report(asyncio.run(proxy(args.n)))
    if args.broker:
        print("broker: ivralo.call of a loopback API (us from the call's start)")
        report(broker(min(args.n, 95)))


if __name__ == "__main__":
    main()
