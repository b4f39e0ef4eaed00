"""What the OS sandbox costs: plain ipykernel, ivralo without the sandbox, ivralo in it; same run.

For each kind, interleaved (A B C, C B A, ...) so the machine's drift does not fold into a ratio:

1. start to ready: ``start_kernel()`` until ``wait_for_ready()`` returns;
2. ``1+1`` round trip (execute until idle and the reply), median of many, on one ready kernel;
3. an allowed HTTP GET from the kernel's Python to a loopback server (urllib) in a server process of
   its own: direct for plain ipykernel and ivralo without the sandbox, through the host's egress
   proxy inside it. Twice: one GET per cell (``GET``: what a person waits for, with ivralo's
   "hosts tried" line and its note from the proxy), and the median of GETs in a loop inside one cell
   (``loop GET``: the request alone);
4. idle memory of the whole tree (USS summed over the launched process and its descendants).

Ratios are against plain ipykernel. Run: ``.venv/bin/python bench/sandbox_cost.py [--starts N]
[--server-delay-ms MS]`` (a server that takes MS to answer, as a remote one does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
from jupyter_client.manager import AsyncKernelManager

from ivralo_kernel.host.jupyter.manager import IvraloKernelManager

if TYPE_CHECKING:
    from harness_api import Context, Metric

KINDS = ("plain", "ivralo", "ivralo-sandbox")


# The server answers from its own process: sharing the host's process (and its GIL) with the egress
# proxy would charge the proxy for the server's work and the server for the proxy's.
ANSWER_SERVER = """
import http.server, sys, time
DELAY_S = float(sys.argv[1])
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        time.sleep(DELAY_S)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer)
print(httpd.server_address[1], flush=True)
httpd.serve_forever()
"""


def manager(kind: str) -> AsyncKernelManager:
    if kind == "plain":
        return AsyncKernelManager(kernel_name="python3")
    return IvraloKernelManager.for_settings(
        python=sys.executable, sandbox="required" if kind.endswith("sandbox") else "off"
    )


def uss_of_tree(pid: int) -> int:
    total = 0
    try:
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            try:
                total += proc.memory_full_info().uss
            except psutil.Error:
                continue
    except psutil.Error:
        return 0
    return total


async def run_until_idle(kc: Any, code: str) -> float:
    started = time.perf_counter()
    reply = await kc.execute_interactive(code, timeout=60, output_hook=lambda _m: None)
    assert reply["content"]["status"] == "ok", reply["content"]
    return time.perf_counter() - started


async def in_cell_median(kc: Any, port: int, gets: int) -> float:
    """The median of ``gets`` GETs timed inside one cell, by the kernel's own clock."""
    code = (
        "import time, urllib.request as u, statistics as s\n"
        f"_t = []\nfor _ in range({gets}):\n"
        "    _s = time.perf_counter()\n"
        f"    u.urlopen('http://127.0.0.1:{port}/', timeout=10).read()\n"
        "    _t.append(time.perf_counter() - _s)\n"
        "s.median(_t)"
    )
    reply = await kc.execute(code, reply=True, timeout=120)
    assert reply["content"]["status"] == "ok", reply["content"]
    result = await kc.execute(code, reply=True, user_expressions={"m": "s.median(_t)"}, timeout=120)
    return float(result["content"]["user_expressions"]["m"]["data"]["text/plain"])


async def one_kernel(kind: str, port: int, round_trips: int, gets: int) -> dict[str, Any]:
    workspace = tempfile.mkdtemp(prefix="ivralo-bench-")
    (Path(workspace) / ".ivralo").mkdir()
    (Path(workspace) / ".ivralo" / "permissions.json").write_text(
        json.dumps({"hosts": {"allow": [f"127.0.0.1:{port}"]}})
    )
    km = manager(kind)
    started = time.perf_counter()
    await km.start_kernel(cwd=workspace)
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
        ready = time.perf_counter() - started
        rtt = [await run_until_idle(kc, "1+1") for _ in range(round_trips)]
        fetch = f"import urllib.request as u\nu.urlopen('http://127.0.0.1:{port}/', timeout=10).read()"
        await run_until_idle(kc, fetch)  # first one: imports
        get = [await run_until_idle(kc, fetch) for _ in range(gets)]
        loop_get = await in_cell_median(kc, port, gets)
        pid = km.provisioner.process.pid if km.provisioner is not None else 0
        uss = uss_of_tree(pid)
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)
    return {
        "ready_s": ready,
        "rtt_s": statistics.median(rtt),
        "get_s": statistics.median(get),
        "loop_get_s": loop_get,
        "uss": uss,
    }


# --------------------------------------------------------------------------- bench/harness.py

LOOP_CELL = """\
import json, time, urllib.request as u
_t = []
for _ in range({gets}):
    _s = time.perf_counter()
    u.urlopen('http://127.0.0.1:{port}/', timeout=10).read()
    _t.append((time.perf_counter() - _s) * 1000)
print(json.dumps(_t))
"""


async def start(kind: str, port: int, root: Path) -> tuple[AsyncKernelManager, Any]:
    workspace = root / f"ws-{kind}"
    (workspace / ".ivralo").mkdir(parents=True)
    (workspace / ".ivralo" / "permissions.json").write_text(json.dumps({"hosts": {"allow": [f"127.0.0.1:{port}"]}}))
    km = manager(kind)
    await km.start_kernel(cwd=str(workspace))
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=60)
    return km, kc


async def loop_gets(kc: Any, port: int, gets: int) -> list[float]:
    """``gets`` GETs timed inside one cell by the kernel's clock (ms each)."""
    out: list[str] = []

    def keep(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            out.append(msg["content"]["text"])

    reply = await kc.execute_interactive(LOOP_CELL.format(gets=gets, port=port), timeout=120, output_hook=keep)
    assert reply["content"]["status"] == "ok", reply["content"]
    line = next(line for line in "".join(out).splitlines() if line.startswith("["))
    return [float(v) for v in json.loads(line)]


async def measure_proxy(ctx: Context, port: int) -> list[Metric]:
    from harness_api import Metric

    kinds = ("plain", "ivralo-sandbox")
    gets, loops = ctx.pick(smoke=(3, 10), full=(40, 100))
    kernels: dict[str, tuple[AsyncKernelManager, Any]] = {}
    per_cell: dict[str, list[float]] = {k: [] for k in kinds}
    in_cell: dict[str, list[float]] = {k: [] for k in kinds}
    fetch = f"import urllib.request as u\nu.urlopen('http://127.0.0.1:{port}/', timeout=10).read()"
    try:
        for kind in kinds:
            kernels[kind] = await start(kind, port, ctx.root)
            await run_until_idle(kernels[kind][1], fetch)  # the first one imports
        for i in range(gets):
            for kind in kinds if i % 2 == 0 else kinds[::-1]:
                per_cell[kind].append(await run_until_idle(kernels[kind][1], fetch) * 1000)
        for i in range(2):  # two cells each, alternating; the samples of the same index are a pair
            for kind in kinds if i % 2 == 0 else kinds[::-1]:
                in_cell[kind] += await loop_gets(kernels[kind][1], port, loops // 2)
        ctx.log(f"  {gets} GET cells and {loops} in-cell GETs per kind done")
    finally:
        for km, kc in kernels.values():
            kc.stop_channels()
            await km.shutdown_kernel(now=True)
    plain, boxed = "plain", "ivralo-sandbox"
    return [
        Metric("egress proxy", "allowed HTTP GET, one per cell (until idle)", "ms", per_cell[boxed], per_cell[plain]),
        Metric(
            "egress proxy", "allowed HTTP GET inside a loop (the request alone)", "ms", in_cell[boxed], in_cell[plain]
        ),
    ]


def harness(ctx: Context) -> list[Metric]:
    """ivralo in its OS sandbox (GETs through the host's egress proxy) against plain ipykernel (direct)."""
    server = subprocess.Popen([sys.executable, "-c", ANSWER_SERVER, "0"], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())  # the handshake: it listens once it has printed its port
        return asyncio.run(measure_proxy(ctx, port))
    finally:
        server.kill()
        server.wait()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--starts", type=int, default=6)
    parser.add_argument("--round-trips", type=int, default=40)
    parser.add_argument("--gets", type=int, default=30)
    # A loopback server answers in microseconds; a remote one takes a network round trip, which
    # the proxy's bookkeeping (noting the decision for the cell's line) overlaps.
    parser.add_argument("--server-delay-ms", type=float, default=0.0)
    args = parser.parse_args()
    delay = str(args.server_delay_ms / 1000)
    server = subprocess.Popen([sys.executable, "-c", ANSWER_SERVER, delay], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    port = int(server.stdout.readline())  # the handshake: it listens once it has printed its port
    samples: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
    for trial in range(args.starts):
        order = KINDS if trial % 2 == 0 else tuple(reversed(KINDS))
        for kind in order:
            samples[kind].append(await one_kernel(kind, port, args.round_trips, args.gets))
    server.kill()
    server.wait()
    summary: dict[str, dict[str, float]] = {}
    for kind in KINDS:
        summary[kind] = {key: statistics.median(s[key] for s in samples[kind]) for key in samples[kind][0]}
    plain = summary["plain"]
    header = f"{'kind':16} {'ready ms':>9} {'x':>6} {'1+1 ms':>8} {'x':>6} {'GET ms':>8} {'+ms':>6}"
    print(f"{header} {'loop GET ms':>12} {'+ms':>6} {'USS MiB':>8}")
    for kind in KINDS:
        s = summary[kind]
        print(
            f"{kind:16} {s['ready_s'] * 1000:9.0f} {s['ready_s'] / plain['ready_s']:6.2f} {s['rtt_s'] * 1000:8.2f} "
            f"{s['rtt_s'] / plain['rtt_s']:6.2f} {s['get_s'] * 1000:8.2f} {(s['get_s'] - plain['get_s']) * 1000:6.2f} "
            f"{s['loop_get_s'] * 1000:12.2f} {(s['loop_get_s'] - plain['loop_get_s']) * 1000:6.2f} "
            f"{s['uss'] / 2**20:8.1f}"
        )
    out = Path(__file__).parent / "results" / f"sandbox_cost-{int(time.time())}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"summary": summary, "samples": samples}, indent=1))
    print(f"samples: {out}")


if __name__ == "__main__":
    asyncio.run(main())
