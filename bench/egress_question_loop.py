"""Repeatability of a person's "yes": N fresh Sessions in a row, each asking once about an unknown
loopback host (nothing allowed in advance); counts hangs (no answer within 30 s) and the server's
hits, judged outside the kernel.

    .venv/bin/python bench/egress_question_loop.py 50
"""

from __future__ import annotations

import asyncio
import http.server
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

BASE = Path(tempfile.mkdtemp(prefix="ivralo-egress-loop-"))
for _var, _sub in (
    ("JUPYTER_CONFIG_DIR", "config"),
    ("JUPYTER_DATA_DIR", "data"),
    ("JUPYTER_RUNTIME_DIR", "runtime"),
    ("IPYTHONDIR", "ipython"),
    ("IVRALO_CONFIG_HOME", "ivralo-config"),
    ("MPLCONFIGDIR", "mpl"),
):
    (BASE / _sub).mkdir()
    os.environ[_var] = str(BASE / _sub)
os.environ["JUPYTER_PLATFORM_DIRS"] = "1"

from ivralo_kernel.host import Session  # noqa: E402 - after Jupyter's folders are isolated

HITS: list[str] = []


class Counting(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        HITS.append(self.path)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


async def yes(question: str, choices: tuple[str, ...]) -> str:
    return "yes"


async def main(runs: int) -> None:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = httpd.server_address[1]
    code = f"import urllib.request\nprint(urllib.request.urlopen('http://localhost:{port}/').status)"
    hangs = 0
    for run in range(runs):
        workspace = BASE / f"ws{run}"
        workspace.mkdir()
        started = time.monotonic()
        async with Session(workspace=workspace, ask=yes) as session:
            try:
                out: object = await asyncio.wait_for(session.run(code), 30)
            except TimeoutError:
                out, hangs = "HANG", hangs + 1
        print(run, repr(out)[:80], f"{time.monotonic() - started:.2f}s", flush=True)
    httpd.shutdown()
    print(f"hangs {hangs} of {runs}; server hits {len(HITS)}")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 50))
