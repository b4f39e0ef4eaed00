"""Servers for tests, on loopback only: a Jupyter server (jupyter_server or JupyterLab), and small
HTTP servers that say which address answered."""

from __future__ import annotations

import contextlib
import errno
import http.server
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

# Where a person's own servers listen in these tests: a random port below Linux's ephemeral range
# (32768-60999). The sandbox's relay connects a ``localhost`` request to a server *inside* the
# sandbox when one listens on that port (a cell's dev server), and ipykernel's own sockets there
# (its iostream pipe) take ephemeral ports: a person's server on an ephemeral port can collide with
# one (seen once in CI: the kernel's pipe got the HTTP request). People's servers use fixed ports
# (3000, 8000, 8888), below that range; so do the tests'.
PERSON_PORTS = range(20000, 32768)


def person_http_server(handler: Callable[..., http.server.BaseHTTPRequestHandler]) -> http.server.ThreadingHTTPServer:
    """A ThreadingHTTPServer on 127.0.0.1 at a free port in PERSON_PORTS (not serving yet)."""
    for _ in range(200):
        try:
            return http.server.ThreadingHTTPServer(("127.0.0.1", random.choice(PERSON_PORTS)), handler)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    raise OSError(errno.EADDRINUSE, f"no free port in {PERSON_PORTS}")


def counting_person_server() -> tuple[http.server.ThreadingHTTPServer, int, list[str]]:
    """A person's server (``person_http_server``) serving this folder, started: (the server, its
    port, the path of each GET it got). The caller shuts it down."""
    hits: list[str] = []

    class Counting(http.server.SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            super().do_GET()

        def log_message(self, *args: object) -> None:
            pass

    httpd = person_http_server(Counting)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, int(httpd.server_address[1]), hits


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def jupyter_server(module: str, root: Path, token: str, *extra: str, timeout: float = 90) -> Iterator[str]:
    """Run ``python -m module`` serving ``root`` on 127.0.0.1; yield its URL once /api/status answers.
    Readiness is that answer (no sleeps); the whole process group is stopped at the end."""
    with jupyter_server_process(module, root, token, *extra, timeout=timeout) as (url, _):
        yield url


@contextmanager
def jupyter_server_process(
    module: str, root: Path, token: str, *extra: str, timeout: float = 90
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``jupyter_server``, yielding the server's process too (a test may kill it)."""
    port = free_port()
    cmd = [
        sys.executable, "-m", module, "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        "--ServerApp.allow_root=True", "--ServerApp.open_browser=False", *extra,
    ]  # fmt: skip
    log_path = root.parent / f"{root.name}-{module}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout
            while True:
                assert proc.poll() is None, log_path.read_text()[-3000:]
                request = urllib.request.Request(f"{url}/api/status", headers={"Authorization": f"token {token}"})
                try:
                    with urllib.request.urlopen(request, timeout=2) as response:
                        if response.status == 200:
                            break
                except OSError:
                    pass
                assert time.monotonic() < deadline, f"{module} did not come up; see {log_path}"
                time.sleep(0.05)
            yield url, proc
        finally:
            with contextlib.suppress(ProcessLookupError):  # a test may have killed the group already
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


class _Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        host, port = self.connection.getsockname()[:2]
        body = f"answered by {host}:{port}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _bind_all(addresses: tuple[str, ...]) -> list[http.server.ThreadingHTTPServer]:
    """One server per address, all on one free port (the first address picks it)."""
    first = http.server.ThreadingHTTPServer((addresses[0], 0), _Answer)
    servers = [first]
    try:
        for address in addresses[1:]:
            servers.append(http.server.ThreadingHTTPServer((address, first.server_address[1]), _Answer))
    except BaseException:
        for server in servers:
            server.server_close()
        raise
    return servers


@contextmanager
def loopback_http(*addresses: str) -> Iterator[int]:
    """HTTP servers on these loopback addresses (e.g. 127.0.0.1, 127.0.0.2), sharing one port,
    which is yielded. Each answers GET with "answered by <address>:<port>"."""
    assert addresses and all(a.startswith("127.") for a in addresses), "loopback addresses only"
    for _ in range(20):  # the port the first address got may be taken on another one
        try:
            servers = _bind_all(addresses)
            break
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    else:
        raise AssertionError(f"no port free on all of {addresses}")
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    try:
        yield int(servers[0].server_address[1])
    finally:
        for server, thread in zip(servers, threads, strict=True):
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)


# The gateway as docs/agents.md says to run it: each websocket frame sent at once (TCP_NODELAY).
PROMPT_WEBSOCKET = "ivralo_kernel.host.jupyter.prompt_websocket.PromptKernelWebsocketConnection"


@contextmanager
def kernel_gateway(
    root: Path, token: str, *extra: str, env: dict[str, str] | None = None, timeout: float = 60
) -> Iterator[tuple[str, int]]:
    """A Jupyter Kernel Gateway on 127.0.0.1 (test-infrastructure.md §3a); yields (its URL, its pid)
    once GET /api answers 200. ``env`` is the gateway's own environment (the credentials live there)."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "kernel_gateway", "--KernelGatewayApp.ip=127.0.0.1",
        f"--KernelGatewayApp.port={port}", "--KernelGatewayApp.port_retries=0",
        f"--KernelGatewayApp.auth_token={token}", "--JupyterWebsocketPersonality.list_kernels=True",
        f"--KernelGatewayApp.kernel_websocket_connection_class={PROMPT_WEBSOCKET}", *extra,
    ]  # fmt: skip
    log_path = root / "kernel-gateway.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout
            while True:
                assert proc.poll() is None, log_path.read_text()[-3000:]
                request = urllib.request.Request(f"{url}/api", headers={"Authorization": f"token {token}"})
                try:
                    with urllib.request.urlopen(request, timeout=2) as response:
                        if response.status == 200:
                            break
                except OSError:
                    pass
                assert time.monotonic() < deadline, f"the kernel gateway did not come up; see {log_path}"
                time.sleep(0.05)
            yield url, proc.pid
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
