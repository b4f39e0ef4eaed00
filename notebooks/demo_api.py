"""A tiny HTTP API on loopback for notebooks/broker.ipynb: the shop's stock, behind DEMO_API_KEY.

Usage: python notebooks/demo_api.py CONFIG_HOME -- COMMAND [ARG...]
Serves on 127.0.0.1 (a free port, never another address), writes CONFIG_HOME/apis.json naming it as
the operation ``shop.stock`` (credential DEMO_API_KEY, sent by the host as a bearer token), runs
COMMAND, then stops and exits with COMMAND's status. The API answers 401 without the key, so a
result in the notebook shows that the host, not the kernel, held it.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

STOCK = {"tea": 40, "coffee": 25, "scone": 12, "cake": 3, "juice": 0, "bagel": 18}


def _handler(key: str) -> type[http.server.BaseHTTPRequestHandler]:
    class Stock(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.headers.get("Authorization") != f"Bearer {key}":
                self._answer(401, {"error": "a valid DEMO_API_KEY is required"})
                return
            item = self.path.removeprefix("/stock/")
            if item not in STOCK:
                self._answer(404, {"error": f"no item {item!r}"})
                return
            self._answer(200, {"item": item, "in_stock": STOCK[item]})

        def _answer(self, status: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    return Stock


@contextmanager
def serve(config_home: str, key: str) -> Iterator[str]:
    """The API on 127.0.0.1 and its apis.json, for the time of the block; yields its URL."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(key))
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    operations = {
        "shop.stock": {
            "url": url + "/stock/{item}",
            "method": "GET",
            "credential": "DEMO_API_KEY",
            "auth": {"kind": "bearer"},
            "params": {"item": {"type": "string", "required": True, "max_length": 40}},
            "max_response_bytes": 10_000,
            "timeout_s": 10,
            "description": "How many of an item the demo shop has in stock",
        }
    }
    Path(config_home).mkdir(parents=True, exist_ok=True)
    apis = Path(config_home, "apis.json")
    apis.write_text(json.dumps({"operations": operations}, indent=1) + "\n", encoding="utf-8")
    thread = threading.Thread(target=httpd.serve_forever, name="demo-api", daemon=True)
    thread.start()
    try:
        yield url
    finally:
        httpd.shutdown()
        httpd.server_close()
        apis.unlink(missing_ok=True)  # its port is gone: a later kernel must not find the operation


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    key = os.environ.get("DEMO_API_KEY")
    if not key:
        print("demo_api.py: set DEMO_API_KEY (make demo does)", file=sys.stderr)
        return 2
    with serve(argv[0], key):
        return subprocess.call(argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
