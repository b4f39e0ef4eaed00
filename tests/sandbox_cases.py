"""What the sandbox tests (and their fallback twins) use to try a route and judge it from outside:
a shell line from the cell, and loopback servers that count what reaches them."""

from __future__ import annotations

import contextlib
import http.server
import os
import shlex
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager
from kernel_helpers import execute
from servers import person_http_server

SECRET = "sk-live-4f9d2c1b8a7e"  # a made-up credential: it must never be readable from the kernel


@contextlib.contextmanager
def started_kernel(kernel_name: str, cwd: Path) -> Iterator[tuple[KernelManager, BlockingKernelClient]]:
    """A kernel of that kernelspec, started in ``cwd`` the way jupyter console starts one, with a
    ready client; both ended afterwards."""
    manager = KernelManager(kernel_name=kernel_name)
    manager.start_kernel(cwd=str(cwd))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        yield manager, client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def sh(kc: BlockingKernelClient, script: str) -> str:
    """Run ``sh -c script`` from the cell, as an agent's first try would; returns what it printed."""
    code = f"import subprocess\nr = subprocess.run(['sh', '-c', {script!r}], capture_output=True, text=True)\n"
    code += "print(r.stdout + r.stderr)"
    done = execute(kc, code, timeout=60)
    assert done.status == "ok", done.outputs
    return done.stdout


class Counter:
    """Connections or datagrams that reached loopback servers, counted where they land. ``close``
    also counts what is still queued, so a hit that came just before the count is not missed."""

    def __init__(self) -> None:
        self.hits = 0
        self._closing = threading.Event()
        self._threads: list[threading.Thread] = []

    def serve(self, listener: socket.socket, datagram: bool = False) -> None:
        listener.settimeout(0.05)

        def take() -> None:
            if datagram:
                listener.recvfrom(65536)
            else:
                listener.accept()[0].close()
            self.hits += 1

        def loop() -> None:
            while not self._closing.is_set():
                with contextlib.suppress(TimeoutError, OSError):
                    take()
            listener.setblocking(False)
            with contextlib.suppress(OSError):
                while True:
                    take()

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        self._threads.append(thread)

    def close(self) -> None:
        self._closing.set()
        for thread in self._threads:
            thread.join(timeout=10)


@contextlib.contextmanager
def tcp_and_udp() -> Iterator[tuple[int, int, Counter, Counter]]:
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.setsockopt(socket.IPPROTO_TCP, 23, 16)  # TCP_FASTOPEN: a SYN with data counts as a hit too
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(16)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    tcp_count, udp_count = Counter(), Counter()
    tcp_count.serve(tcp)
    udp_count.serve(udp, datagram=True)
    try:
        yield tcp.getsockname()[1], udp.getsockname()[1], tcp_count, udp_count
    finally:
        tcp_count.close()
        udp_count.close()
        tcp.close()
        udp.close()


@contextlib.contextmanager
def unix_servers() -> Iterator[tuple[list[str], list[Counter]]]:
    """Unix socket servers where the person's tools keep theirs: /tmp, /run/user/<uid>, abstract
    (one counter each, read after the block)."""
    counters = [Counter(), Counter(), Counter()]
    made: list[Path] = []
    run_user = Path(f"/run/user/{os.getuid()}")
    if not run_user.exists():
        run_user.mkdir(parents=True)
        made.append(run_user)
    addresses = [
        f"/tmp/ivralo-test-{uuid.uuid4().hex[:8]}.sock",
        str(run_user / f"ivralo-test-{uuid.uuid4().hex[:8]}.sock"),
        f"\0ivralo-test-{uuid.uuid4().hex[:8]}",
    ]
    listeners = []
    for address, counter in zip(addresses, counters, strict=True):
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(address)
        listener.listen(8)
        counter.serve(listener)
        listeners.append(listener)
    try:
        yield addresses, counters
    finally:
        for counter in counters:
            counter.close()
        for listener, address in zip(listeners, addresses, strict=True):
            listener.close()
            if not address.startswith("\0"):
                Path(address).unlink(missing_ok=True)
        for path in made:
            path.rmdir()


@contextlib.contextmanager
def counting_http() -> Iterator[tuple[int, list[str]]]:
    """An HTTP server on 127.0.0.1 (the person's machine, seen from the sandbox through the proxy)
    that records each request path it answers."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            body = b"hello from the host"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = person_http_server(Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(httpd.server_address[1]), hits
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


UNIX_PROBE = (
    "import socket, sys\n"
    "for a in sys.argv[1:]:\n"
    "    s = socket.socket(socket.AF_UNIX)\n"
    "    try:\n        s.connect(a.replace('@', chr(0), 1)); print('connected', repr(a))\n"
    "    except OSError as e:\n        print('refused', repr(a), e.errno)\n"
)


def try_unix_sockets(kc: BlockingKernelClient, addresses: list[str]) -> str:
    """Connect to each address from a ``python -I`` child and from the kernel's own Python."""
    printable = [a.replace("\0", "@") for a in addresses]
    said = sh(kc, f"python3 -I -c {shlex.quote(UNIX_PROBE)} {' '.join(map(shlex.quote, printable))}")
    assert "SyntaxError" not in said, said
    done = execute(kc, UNIX_PROBE.replace("sys.argv[1:]", repr(printable)))
    return said + done.stdout


def try_network_routes(kc: BlockingKernelClient, tcp_port: int, udp_port: int) -> str:
    """TCP Fast Open and UDP ``sendmsg``, a ctypes ``connect``, curl with and without the proxy, and
    a ``python -I`` child, to loopback servers; nobody is there to be asked. Returns what each got."""
    code = f"""
import ctypes, socket, subprocess
tries = []
def attempt(name, fn):
    try:
        fn(); tries.append(name + ' done')
    except BaseException as e:
        tries.append(f'{{name}} {{type(e).__name__}}')
def fastopen():
    s = socket.socket(); s.sendmsg([b'GET / HTTP/1.0\\r\\n\\r\\n'], [], 0x20000000, ('127.0.0.1', {tcp_port}))
def udp():
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendmsg([b'x'], [], 0, ('127.0.0.1', {udp_port}))
def raw_connect():
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.socket(2, 1, 0)
    addr = (ctypes.c_ubyte * 16)(2, 0, {tcp_port >> 8}, {tcp_port & 255}, 127, 0, 0, 1)
    if libc.connect(fd, addr, 16) != 0:
        raise OSError(ctypes.get_errno(), 'connect')
attempt('fastopen', fastopen)
attempt('udp', udp)
attempt('ctypes', raw_connect)
url = 'http://127.0.0.1:{tcp_port}/'
r = subprocess.run(['curl', '-sS', '--max-time', '5', '--noproxy', '*', url], capture_output=True, text=True)
tries.append(f'curl direct {{r.returncode}} {{r.stderr.strip()}}')
r = subprocess.run(['curl', '-sS', '--max-time', '5', url], capture_output=True, text=True)
tries.append(f'curl via proxy {{r.returncode}} {{r.stdout.strip()[:200]}}')
child = "import socket; socket.create_connection(('127.0.0.1', {tcp_port}), timeout=5)"
r = subprocess.run(['python3', '-I', '-c', child], capture_output=True, text=True)
tries.append(f'python -I {{r.returncode}}')
print('\\n'.join(tries))
"""
    return execute(kc, code, timeout=90, allow_stdin=False).stdout  # allow_stdin off: nobody to ask
