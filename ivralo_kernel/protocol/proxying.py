"""[protocol] What a proxied HTTP request asks for, and moving its bytes (stdlib only).

The host's egress proxy and the sandbox's relay both read the first bytes of a connection: an HTTP
``CONNECT host:port`` (HTTPS, git, pip) or a plain request in absolute form
(``GET http://host:port/path``). Everything after the head is passed through untouched.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024
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


def read_head(conn: socket.socket) -> tuple[bytes, bytes]:
    """Read through the blank line that ends the head; returns (head, bytes already read after it)."""
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD_BYTES:
            raise BadRequest("request head too large")
        chunk = conn.recv(65536)
        if not chunk:
            raise BadRequest("connection closed before the request head ended")
        data += chunk
    end = data.index(b"\r\n\r\n") + 4
    return data[:end], data[end:]


def parse_head(head: bytes) -> ProxyRequest:
    try:
        line = head.split(b"\r\n", 1)[0].decode("ascii")
        method, target, _version = line.split(" ")
    except (UnicodeDecodeError, ValueError):
        raise BadRequest("not an HTTP request line") from None
    if method == "CONNECT":
        host, _, port_text = target.rpartition(":")
        if not host or not port_text.isdigit():
            raise BadRequest(f"CONNECT needs host:port, got {target[:80]!r}")
        port = int(port_text)
    else:
        parts = urlsplit(target)
        if parts.scheme != "http" or not parts.hostname:
            raise BadRequest("a plain request must name an http:// URL (HTTPS goes through CONNECT)")
        host, port = parts.hostname, parts.port or 80
    host = host.strip("[]").lower().rstrip(".")
    if not host or not 0 < port < 65536:
        raise BadRequest(f"no valid host and port in {target[:80]!r}")
    return ProxyRequest(method, host, port, target, head)


def response(status: int, reason: str, text: str = "") -> bytes:
    """A short answer to the client (a refusal says why in its status line and body)."""
    body = (text + "\n").encode() if text else b""
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
    head += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    return head.encode() + body


TUNNEL_ESTABLISHED = b"HTTP/1.1 200 Connection established\r\n\r\n"


def splice(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until both sides have finished; then close both. Blocks the caller."""

    def copy(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    other = threading.Thread(target=copy, args=(b, a), name="ivralo-splice", daemon=True)
    other.start()
    copy(a, b)
    other.join()
    for s in (a, b):
        with contextlib.suppress(OSError):
            s.close()
