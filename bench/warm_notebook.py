"""A new notebook's kernel in JupyterLab's path: from the server's ``POST /api/kernels`` to the
kernel's ``kernel_info_reply`` over the kernel websocket, with and without a warm spare (``spares``).

One jupyter_server, two kernelspecs: ``ivralo-cold`` (spares=0) and ``ivralo-warm`` (spares=1), both
sandboxed. The folder's first warm kernel starts the pool; before each warm trial the bench waits for
the pool's "ready" line in the server's log (a handshake under a deadline, no sleep). Cold and warm
trials alternate; the harness pairs them. Goal (issue 17): warm <= 100 ms.

The time also splits in two: the POST (jupyter_server's own path, which includes our provisioner's
pre_launch/launch/post_launch) and the rest (websocket connect, the request through the relay,
the reply back).

    .venv/bin/python bench/warm_notebook.py [--trials N]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent / "tests"))
sys.path.insert(0, str(BENCH_DIR))

TOKEN = uuid.uuid4().hex
H = {"Authorization": f"token {TOKEN}"}
READY = re.compile(r"ivralo: a warm spare kernel \(pid (\d+)\) is ready for .+ \(ivralo-warm\)")
READY_TIMEOUT_S = 120.0


@dataclass
class Samples:
    cold_ms: list[float] = field(default_factory=list)
    warm_ms: list[float] = field(default_factory=list)
    warm_post_ms: list[float] = field(default_factory=list)  # of warm_ms: the POST alone
    adopted: int = 0  # warm trials whose kernel was a spare (the server's log says so)


def kernel_info_ms(url: str, spec: str) -> tuple[float, float, str]:
    """(POST -> kernel_info_reply, the POST alone, the kernel's id), in ms."""
    import requests
    import websocket

    t0 = time.perf_counter()
    response = requests.post(f"{url}/api/kernels", json={"name": spec, "path": ""}, headers=H, timeout=120)
    response.raise_for_status()
    post_ms = (time.perf_counter() - t0) * 1000
    kernel_id = response.json()["id"]
    ws = websocket.create_connection(
        url.replace("http", "ws") + f"/api/kernels/{kernel_id}/channels", header=[f"Authorization: token {TOKEN}"]
    )
    msg_id = uuid.uuid4().hex
    header = {"msg_id": msg_id, "msg_type": "kernel_info_request", "username": "bench", "session": uuid.uuid4().hex,
              "version": "5.4", "date": datetime.now(UTC).isoformat()}  # fmt: skip
    ws.send(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "content": {}, "channel": "shell",
                        "buffers": []}))  # fmt: skip
    ws.settimeout(120)
    while True:
        msg = json.loads(ws.recv())
        if msg.get("parent_header", {}).get("msg_id") == msg_id and msg["header"]["msg_type"] == "kernel_info_reply":
            break
    elapsed = (time.perf_counter() - t0) * 1000
    ws.close()
    return elapsed, post_ms, kernel_id


def wait_ready(log: Path, count: int) -> None:
    """Until the server's log has announced ``count`` ready warm spares (a handshake, under a deadline)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while len(READY.findall(log.read_text(errors="replace"))) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no warm spare became ready; see {log}")
        time.sleep(0.05)


def measure(base: Path, trials: int) -> Samples:
    """Cold and warm trials, alternating, against one jupyter_server serving ``base / "root"``."""
    import requests
    from servers import jupyter_server

    from ivralo_kernel.cli.install import install

    prefix = Path(os.environ["JUPYTER_PATH"]).parents[1]
    install(prefix=str(prefix), name="ivralo-cold", provisioner_config={"spares": 0, "sandbox": "required"})
    install(prefix=str(prefix), name="ivralo-warm", provisioner_config={"spares": 1, "sandbox": "required"})
    root = base / "root"
    root.mkdir()
    log = base / "root-jupyter_server.log"  # servers.jupyter_server's, beside the root
    samples = Samples()
    with jupyter_server("jupyter_server", root, TOKEN) as url:
        kernel_info_ms(url, "ivralo-warm")  # the folder's first kernel: the pool fills after it
        for n in range(trials):
            samples.cold_ms.append(kernel_info_ms(url, "ivralo-cold")[0])
            wait_ready(log, n + 1)
            ms, post_ms, _ = kernel_info_ms(url, "ivralo-warm")
            samples.warm_ms.append(ms)
            samples.warm_post_ms.append(post_ms)
        for kernel in requests.get(f"{url}/api/kernels", headers=H, timeout=30).json():
            requests.delete(f"{url}/api/kernels/{kernel['id']}", headers=H, timeout=60)
    samples.adopted = log.read_text(errors="replace").count("a warm spare kernel (pid")
    samples.adopted -= len(READY.findall(log.read_text(errors="replace")))
    return samples


def harness(ctx: Any) -> list[Any]:
    """The new notebook's kernel_info, from the POST: warm spare vs cold start, paired by trial."""
    from harness_api import LATENCY, Metric

    samples = measure(ctx.root, ctx.pick(smoke=2, full=10))
    ctx.notes.append(
        f"warm notebook: {samples.adopted} of {len(samples.warm_ms)} warm trials got a spare; of the warm time, "
        f"the POST /api/kernels alone took a median {statistics.median(samples.warm_post_ms):.0f} ms"
    )
    return [
        Metric(
            "warm notebook",
            "POST /api/kernels -> kernel_info_reply (JupyterLab's path), warm spare",
            "ms",
            samples.warm_ms,
            samples.cold_ms,
            baseline_label="spares=0 (cold start)",
            plot=LATENCY,
            note="goal: <= 100 ms warm",
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=10)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ivralo-bench-"))
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        (base / var).mkdir()
        os.environ[var] = str(base / var)
    os.environ["JUPYTER_PATH"] = str(base / "prefix" / "share" / "jupyter")
    s = measure(base, args.trials)
    from harness import percentile

    print(f"POST /api/kernels -> kernel_info_reply, {args.trials} trials each (ms)")
    for name, values in (
        ("cold (spares=0)", s.cold_ms),
        ("warm (spares=1)", s.warm_ms),
        ("  of it, POST", s.warm_post_ms),
    ):
        median, p95 = percentile(values, 50), percentile(values, 95)
        print(f"  {name:16} median {median:7.1f}  p95 {p95:7.1f}  {[round(x) for x in values]}")
    print(f"  warm trials that got a spare: {s.adopted} of {len(s.warm_ms)}")


if __name__ == "__main__":
    main()
