"""[host] The HTTP client that makes the broker's API calls: the standard library's ``http.client``,
one kept-alive connection per origin and calling thread at a time.

A brokered call is one request to a URL the host's registry fixed: no redirect is followed (it would
carry the credential elsewhere), no proxy or ``.netrc`` is read from the environment, no cookie is
kept, HTTP/1.1 only. That is what ``http.client`` does by itself, and it is what httpx's client was
configured to do here; httpx's request building and transport cost about 350 us more a call (on a
loopback API, 550 against 190 us; ``bench/hot_path_breakdown.py --broker``), a third of what
``ivralo.call`` costs over the API's own time. HTTPS verifies against certifi's CA bundle, as httpx
did (the gateway client still uses httpx).
"""

from __future__ import annotations

import contextlib
import http.client
import select
import ssl
import threading
from dataclasses import dataclass
from email.message import Message
from urllib.parse import urlsplit

# A connection the server closed while it sat idle, found out only when the request is sent: the
# request goes again on a new connection, once, when repeating it cannot do anything twice.
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})
IDLE_PER_ORIGIN = 4  # CALL_THREADS calls at once at most; more than that are closed after use
READ_CHUNK = 65536


class ResponseTooLarge(Exception):
    """The response went past the cap given: nothing more of it is read."""


@dataclass(frozen=True)
class ApiRequest:
    method: str
    url: str  # absolute, http or https; its path and query already percent-encoded
    headers: dict[str, str]
    body: bytes | None = None


@dataclass(frozen=True)
class ApiResponse:
    status: int
    headers: Message
    content: bytes

    @property
    def text(self) -> str:
        charset = self.headers.get_content_charset() or "utf-8"
        try:
            return self.content.decode(charset, "replace")
        except LookupError:  # a charset Python does not know
            return self.content.decode("utf-8", "replace")


Origin = tuple[str, str, int]  # scheme, host, port


class ApiHttp:
    """Sends ``ApiRequest``s; thread-safe (a connection serves one call at a time)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[Origin, list[http.client.HTTPConnection]] = {}
        self._tls: ssl.SSLContext | None = None
        self._closed = False

    def send(self, request: ApiRequest, timeout_s: float, max_bytes: int) -> ApiResponse:
        """The response, read whole; ``ResponseTooLarge`` past ``max_bytes`` of body. ``OSError``
        (``TimeoutError`` included) and ``http.client.HTTPException`` when the server cannot be
        reached or does not speak HTTP."""
        parts = urlsplit(request.url)
        scheme, host = parts.scheme, parts.hostname
        if scheme not in ("http", "https") or not host:
            raise ValueError("an API operation's URL must be an http(s) URL with a host")
        if not host.isascii():  # an internationalized name, as DNS knows it
            host = host.encode("idna").decode("ascii")
        origin: Origin = (scheme, host, parts.port or (443 if scheme == "https" else 80))
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn, reused = self._take(origin, timeout_s)
        try:
            try:
                response = self._exchange(conn, request, target)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                if not reused or request.method not in IDEMPOTENT:
                    raise
                conn.close()  # the server had closed it as it sat idle: once more, on a new one
                response = self._exchange(conn, request, target)
            content = _read_capped(response, max_bytes)
        except BaseException:
            conn.close()
            raise
        self._give_back(origin, conn, keep=not response.will_close)
        return ApiResponse(response.status, response.headers, content)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()

    def _exchange(self, conn: http.client.HTTPConnection, request: ApiRequest, target: str) -> http.client.HTTPResponse:
        conn.request(request.method, target, body=request.body, headers=request.headers)
        return conn.getresponse()

    def _take(self, origin: Origin, timeout_s: float) -> tuple[http.client.HTTPConnection, bool]:
        """An idle connection to ``origin`` that is still open, or a new one (it connects as it sends)."""
        with self._lock:
            idle = self._idle.get(origin, [])
            while idle:
                conn = idle.pop()
                if _still_open(conn):
                    conn.timeout = timeout_s
                    if conn.sock is not None:
                        conn.sock.settimeout(timeout_s)
                    return conn, True
                conn.close()
        scheme, host, port = origin
        if scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=timeout_s, context=self._tls_context()), False
        return http.client.HTTPConnection(host, port, timeout=timeout_s), False

    def _give_back(self, origin: Origin, conn: http.client.HTTPConnection, keep: bool) -> None:
        with self._lock:
            idle = self._idle.setdefault(origin, [])
            if keep and not self._closed and len(idle) < IDLE_PER_ORIGIN:
                idle.append(conn)
                return
        conn.close()

    def _tls_context(self) -> ssl.SSLContext:
        with self._lock:
            if self._tls is None:
                import certifi  # here: a broker that never calls an HTTPS API never reads the bundle

                self._tls = ssl.create_default_context(cafile=certifi.where())
            return self._tls


def _still_open(conn: http.client.HTTPConnection) -> bool:
    """An idle connection has nothing to read: if it is readable, the server closed it (or sent
    bytes nobody asked for), and it is not used again."""
    sock = conn.sock
    if sock is None:
        return False
    with contextlib.suppress(OSError, ValueError):
        readable, _, _ = select.select([sock], [], [], 0)
        return not readable
    return False


def _read_capped(response: http.client.HTTPResponse, max_bytes: int) -> bytes:
    chunks, size = [], 0
    while chunk := response.read(READ_CHUNK):
        size += len(chunk)
        if size > max_bytes:
            raise ResponseTooLarge(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)
