"""[protocol] What a proxied HTTP request asks for, and moving its bytes (stdlib only).

The host's egress proxy and the sandbox's relay both read the first bytes of a connection: an HTTP
``CONNECT host:port`` (HTTPS, git, pip) or a plain request in absolute form
(``GET http://host:port/path``). Everything after the head is passed through untouched.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from ivralo_kernel.protocol.network.egress_names import HostNameError, normalize
from ivralo_kernel.protocol.terminal import terminal_safe

MAX_HEAD_BYTES = 64 * 1024
# A client that opens a connection and sends no head (or one byte a minute) holds a thread: the head
# must be in within this long. Only the head: a tunnel's bytes afterwards may be as slow as they like.
HEAD_TIMEOUT_S = 30.0
_HOP_BY_HOP = (b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive")


class BadRequest(ValueError):
    """The bytes are not a proxy request we serve."""


@dataclass(frozen=True)
class ProxyRequest:
    method: str
    host: str  # lower case, no brackets, no trailing dot
    port: int
    target: str  # the request target as sent (authority for CONNECT, absolute URL otherwise)
    head: bytes  # the head as received, through the blank line

    @property
    def tunnel(self) -> bool:
        return self.method == "CONNECT"

    def origin_head(self) -> bytes:
        """The head for the origin server: the path-only request line, no proxy headers, one request
        per connection (a keep-alive connection could name another host next)."""
        lines = self.head.split(b"\r\n")
        parts = urlsplit(self.target)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        version = lines[0].rsplit(b" ", 1)[-1]
        out = [f"{self.method} {path} ".encode() + version]
        for line in lines[1:]:
            if not line:
                continue
            name = line.split(b":", 1)[0].strip().lower()
            if name not in _HOP_BY_HOP:
                out.append(line)
        out.append(b"Connection: close")
        return b"\r\n".join(out) + b"\r\n\r\n"


def read_head(conn: socket.socket, data: bytes = b"") -> tuple[bytes, bytes]:
    """Read through the blank line that ends the head (``data``: what was read of it already);
    returns (head, bytes already read after it)."""
    conn.settimeout(HEAD_TIMEOUT_S)
    try:
        while b"\r\n\r\n" not in data:
            if len(data) > MAX_HEAD_BYTES:
                raise BadRequest(f"the request head is larger than {MAX_HEAD_BYTES // 1024} KiB")
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                raise BadRequest(f"no complete request head within {HEAD_TIMEOUT_S:.0f} s") from None
            if not chunk:
                raise BadRequest("connection closed before the request head ended")
            data += chunk
    finally:
        conn.settimeout(None)
    end = data.index(b"\r\n\r\n") + 4
    if end > MAX_HEAD_BYTES:
        raise BadRequest(f"the request head is larger than {MAX_HEAD_BYTES // 1024} KiB")
    return data[:end], data[end:]


def parse_head(head: bytes) -> ProxyRequest:
    try:
        line = head.split(b"\r\n", 1)[0].decode("ascii")
        method, target, version = line.split(" ")
        if not version.startswith("HTTP/") or not method.isalpha():
            raise ValueError(version)
    except (UnicodeDecodeError, ValueError):
        raise BadRequest("not an HTTP request line (METHOD TARGET HTTP/1.1, in ASCII)") from None
    shown = terminal_safe(target[:80])
    if method == "CONNECT":
        host, _, port_text = target.rpartition(":")
        if not host or not port_text.isdigit():
            raise BadRequest(f"CONNECT needs host:port, got {shown!r}")
        port = int(port_text)
    else:
        try:  # urlsplit raises for a bad port or bracket ("http://h:99999/", "http://[::1/")
            parts = urlsplit(target)
            hostname, port = parts.hostname, parts.port or 80
        except ValueError as exc:
            raise BadRequest(f"{terminal_safe(str(exc))} in {shown!r}") from None
        if parts.scheme != "http" or not hostname:
            raise BadRequest("a plain request must name an http:// URL (HTTPS goes through CONNECT)")
        host = hostname
    if not 0 < port < 65536:
        raise BadRequest(f"the port is not 1-65535 in {shown!r}")
    try:
        normalize(host)
    except HostNameError as exc:
        raise BadRequest(f"{exc}: {shown!r}") from None
    host = host.strip("[]").lower().rstrip(".")
    return ProxyRequest(method, host, port, target, head)


def response(status: int, reason: str, text: str = "") -> bytes:
    """A short answer to the client (a refusal says why in its status line and body)."""
    body = (text + "\n").encode() if text else b""
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
    head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    return head.encode() + body


def _preamble_length(data: bytes) -> int:
    (length,) = _PREAMBLE_LENGTH.unpack_from(data)
    if length > MAX_PREAMBLE_BYTES:
        raise BadRequest(f"the request head is larger than {MAX_HEAD_BYTES // 1024} KiB")
    return int(length)


SPARE_ACCEPTORS = 2  # threads kept waiting in accept(), so that a request never waits for one to start


def serve_each(listener: socket.socket, serve: Callable[[socket.socket], None], name: str) -> None:
    """Accept connections on ``listener`` until it is closed, and ``serve`` each on a thread of its own.

    Threads wait in ``accept()`` side by side (Linux wakes one per connection), and the thread that
    accepted a connection serves it: a request never waits for a thread to be started and
    scheduled, which on a busy machine cost more than the request itself. A new thread is started
    only when none is left waiting (a long tunnel holds its thread), and a thread that finds enough
    others waiting after its connection ends, ends."""
    Acceptors(listener, serve, name).start()


class Acceptors:
    def __init__(self, listener: socket.socket, serve: Callable[[socket.socket], None], name: str) -> None:
        self.listener, self.serve, self.name = listener, serve, name
        self._lock = threading.Lock()
        self._waiting = 0

    def start(self) -> None:
        for _ in range(SPARE_ACCEPTORS):
            self._spawn()

    def _spawn(self) -> bool:
        try:
            threading.Thread(target=self._run, name=self.name, daemon=True).start()
        except RuntimeError:  # no thread to be had: the ones there are go on
            return False
        return True

    def _run(self) -> None:
        while True:
            with self._lock:
                self._waiting += 1
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed
                with self._lock:
                    self._waiting -= 1
                return
            with self._lock:
                self._waiting -= 1
                alone = self._waiting == 0
            if alone:
                self._spawn()
            self.serve(conn)
            with self._lock:
                if self._waiting >= SPARE_ACCEPTORS:
                    return


TUNNEL_ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"

# The relay hands the host the client's connection itself (SCM_RIGHTS), with the bytes it read of it:
# the host then answers the client directly, and no process between them copies a byte. The preamble
# (head and what came with it) ends where the relay closes the unix connection.
MAX_HANDED_FDS = 4  # any more than one is closed unread
MAX_PREAMBLE_BYTES = 2 * MAX_HEAD_BYTES + 65536


_PREAMBLE_LENGTH = struct.Struct("!I")


def hand_over(upstream: socket.socket, conn: socket.socket, data: bytes) -> None:
    """(the relay) Give ``conn`` and what was read of it to the host, over the unix ``upstream``: the
    length first, so that the host knows it has it all without waiting for this end to close."""
    message = _PREAMBLE_LENGTH.pack(len(data)) + data
    sent = socket.send_fds(upstream, [message], [conn.fileno()])
    if sent < len(message):
        upstream.sendall(message[sent:])


def handed_over(conn: socket.socket) -> tuple[socket.socket, bytes]:
    """(the host) The connection to serve and the bytes already read of it: the client's own, when the
    relay handed it over, or else ``conn`` itself (a client speaking on the unix socket directly).

    Whatever the sender passed, only a stream socket is served; anything else is refused, and every
    descriptor received is closed or owned by the returned socket."""
    conn.settimeout(HEAD_TIMEOUT_S)
    try:
        try:
            data, fds, _flags, _address = socket.recv_fds(conn, 65536, MAX_HANDED_FDS)
        except TimeoutError:
            raise BadRequest(f"no complete request head within {HEAD_TIMEOUT_S:.0f} s") from None
        if not fds:
            return conn, data
        handed, *extra = fds
        for fd in extra:
            with contextlib.suppress(OSError):
                os.close(fd)
        try:
            client = socket.socket(fileno=handed)
        except OSError:
            os.close(handed)
            raise BadRequest("what was handed over is not a socket") from None
        if client.type != socket.SOCK_STREAM:
            client.close()
            raise BadRequest("what was handed over is not a stream socket")
        try:
            while len(data) < _PREAMBLE_LENGTH.size or len(data) < _PREAMBLE_LENGTH.size + _preamble_length(data):
                chunk = conn.recv(65536)
                if not chunk:
                    raise BadRequest("the relay's connection closed before the request head ended")
                data += chunk
            length = _preamble_length(data)
            if len(data) != _PREAMBLE_LENGTH.size + length:
                raise BadRequest("more bytes came with the handed-over connection than its length said")
        except TimeoutError:
            client.close()
            raise BadRequest(f"no complete request head within {HEAD_TIMEOUT_S:.0f} s") from None
        except BadRequest:
            client.close()
            raise
        data = data[_PREAMBLE_LENGTH.size :]
        client.settimeout(None)  # blocking, whatever the sender set on it
        with contextlib.suppress(OSError):
            conn.close()
        return client, data
    finally:
        with contextlib.suppress(OSError):
            conn.settimeout(None)


def splice(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until both sides have finished; then close both. Blocks the caller.

    One thread moves both ways (a poll loop, at most one chunk held per way), not a thread per way:
    a request through the relay and the host's proxy started four threads and handed the GIL
    between them at every byte's arrival, which was most of what a proxied request cost. A way
    ends at its source's end of file (or an error on either of its sockets); its destination is then
    shut for writing, as before, and the other way goes on until it ends too."""
    try:
        _pump(a, b)
    finally:
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.close()


class _Way:
    """One direction of a splice: bytes read from ``src``, not yet written to ``dst``."""

    __slots__ = ("done", "dst", "pending", "src")

    def __init__(self, src: socket.socket, dst: socket.socket) -> None:
        self.src, self.dst = src, dst
        self.pending = b""
        self.done = False

    def read(self) -> None:
        try:
            chunk = self.src.recv(CHUNK_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.finish()
            return
        self.pending = chunk
        self.write()  # at once: the destination can almost always take it, which saves a poll

    def write(self) -> None:
        try:
            sent = self.dst.send(self.pending)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.finish()
            return
        self.pending = self.pending[sent:]

    def finish(self) -> None:
        self.pending, self.done = b"", True
        with contextlib.suppress(OSError):
            self.dst.shutdown(socket.SHUT_WR)


CHUNK_BYTES = 65536
_READ, _WRITE = select.POLLIN | select.POLLPRI, select.POLLOUT
_TROUBLE = select.POLLERR | select.POLLHUP | select.POLLNVAL


def _pump(a: socket.socket, b: socket.socket) -> None:
    ways = (_Way(a, b), _Way(b, a))
    for s in (a, b):
        s.setblocking(False)
    poller = select.poll()
    watched: dict[int, int] = {}
    while not all(way.done for way in ways):
        wanted = {a.fileno(): 0, b.fileno(): 0}
        for way in ways:
            if way.done:
                continue
            if way.pending:
                wanted[way.dst.fileno()] |= _WRITE
            else:
                wanted[way.src.fileno()] |= _READ
        for fd, mask in wanted.items():
            if watched.get(fd) == mask:
                continue
            if mask:
                (poller.modify if fd in watched else poller.register)(fd, mask)
                watched[fd] = mask
            elif fd in watched:  # nothing wanted: an end-of-line POLLHUP here must not spin the loop
                poller.unregister(fd)
                del watched[fd]
        events = dict(poller.poll())
        for way in ways:
            if way.done:
                continue
            if way.pending:
                if events.get(way.dst.fileno(), 0) & (_WRITE | _TROUBLE):
                    way.write()
            elif events.get(way.src.fileno(), 0) & (_READ | _TROUBLE):
                way.read()
