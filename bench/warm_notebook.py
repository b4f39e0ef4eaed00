"""A new notebook's kernel in JupyterLab's path: from the server's ``POST /api/kernels`` to the
kernel's ``kernel_info_reply`` over the kernel websocket, with and without a warm spare (``spares``).

One jupyter_server, two kernelspecs: ``ivralo-cold`` (spares=0) and ``ivralo-warm`` (spares=1). A
warm trial first waits for the spare to exist (a new supervisor under the server) and settle. Cold and
warm trials are interleaved; medians are reported. Goal: warm <= 100 ms.

    .venv/bin/python bench/warm_notebook.py [--trials N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import psutil
import requests
import websocket

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from servers import jupyter_server

from ivralo_kernel.cli.install import install
from ivralo_kernel.host.kernelspec import SUPERVISOR_MODULE

TOKEN = uuid.uuid4().hex
H = {"Authorization": f"token {TOKEN}"}
SETTLE_S = 3.0  # a spare's first kernel_info is answered by the pool itself; this lets its start settle


def supervisors(server_pid: int) -> set[int]:
    found = set()
    for proc in psutil.Process(server_pid).children(recursive=True):
        try:
            if SUPERVISOR_MODULE in " ".join(proc.cmdline()):
                found.add(proc.pid)
        except psutil.Error:
            pass
    return found


def server_pid(port: int) -> int:
    for conn in psutil.net_connections("tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
            return int(conn.pid)
    raise RuntimeError("no server")


def kernel_info_ms(url: str, spec: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    response = requests.post(f"{url}/api/kernels", json={"name": spec, "path": "ws"}, headers=H, timeout=120)
    response.raise_for_status()
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
    return elapsed, kernel_id


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ivralo-bench-"))
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        (base / var).mkdir()
        os.environ[var] = str(base / var)
    prefix = base / "prefix"
    os.environ["JUPYTER_PATH"] = str(prefix / "share" / "jupyter")
    install(prefix=str(prefix), name="ivralo-cold", provisioner_config={"spares": 0})
    install(prefix=str(prefix), name="ivralo-warm", provisioner_config={"spares": 1})
    root = base / "root"
    (root / "ws").mkdir(parents=True)
    cold: list[float] = []
    warm: list[float] = []
    with jupyter_server("jupyter_server", root, TOKEN) as url:
        pid = server_pid(int(url.rsplit(":", 1)[1]))
        ids = [kernel_info_ms(url, "ivralo-warm")[1]]  # the workspace's first kernel: the pool fills after it
        for _ in range(args.trials):
            cold.append(kernel_info_ms(url, "ivralo-cold")[0])
            deadline = time.monotonic() + 120
            while len(supervisors(pid)) <= len(ids) + len(cold) and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(SETTLE_S)
            ms, kernel_id = kernel_info_ms(url, "ivralo-warm")
            warm.append(ms)
            ids.append(kernel_id)
        for kernel_id in requests.get(f"{url}/api/kernels", headers=H, timeout=30).json():
            requests.delete(f"{url}/api/kernels/{kernel_id['id']}", headers=H, timeout=60)
    print(f"POST /api/kernels -> kernel_info_reply, {args.trials} trials each")
    print(f"  cold (spares=0): median {statistics.median(cold):.1f} ms  {[round(x) for x in cold]}")
    print(f"  warm (spares=1): median {statistics.median(warm):.1f} ms  {[round(x) for x in warm]}")


if __name__ == "__main__":
    main()
