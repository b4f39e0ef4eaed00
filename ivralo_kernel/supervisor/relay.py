"""[supervisor] The sandbox's way out: a proxy address on the sandbox's loopback that hands each
connection to the host's egress proxy (a unix socket bound into the sandbox).

The kernel and its children get ``HTTP_PROXY``/``HTTPS_PROXY``/``ALL_PROXY`` pointing here, so pip,
curl, git, requests, httpx and urllib all come this way. The relay decides nothing: the host judges
every ``host:port``, asks whoever it asks, and resolves the name only after a yes.

Loopback has two meanings. A request for ``localhost:PORT`` where something inside the sandbox
listens on PORT (a dev server the cell started, a local cluster) is the kernel's own traffic: it is
connected here, inside, and nobody is asked. Otherwise ``localhost`` means the person's machine, and
the request goes to the host like any other.

In the fallback (no sandbox, so no network namespace) the relay listens on a loopback port the OS
picks, bound before the kernel is forked so that the kernel's Landlock TCP rule can name it, and it
has no shortcut: every loopback port there is the person's machine, so every request goes to the host.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys

from ivralo_kernel.protocol.network.egress import is_loopback
from ivralo_kernel.protocol.network.proxying import (
    TUNNEL_ESTABLISHED,
    BadRequest,
    hand_over,
    parse_head,
    read_head,
    response,
    serve_each,
    splice,
)

LOCAL_CONNECT_TIMEOUT_S = 1.0


class Relay:
    def __init__(self, port: int, upstream: str, *, inside_shortcut: bool = True) -> None:
        self.port, self.upstream, self.inside_shortcut = port, upstream, inside_shortcut
        self._listeners: list[socket.socket] = []
        for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            listener = socket.socket(family, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                listener.bind((address, self.port))
            except OSError:
                listener.close()  # no IPv6 in this sandbox: IPv4 alone is enough
                if family == socket.AF_INET and self.port == 0:
                    raise
                continue
            self.port = listener.getsockname()[1]  # port 0: the OS's choice, kept for ::1 too
            listener.listen(64)
            os.set_inheritable(listener.fileno(), False)
            self._listeners.append(listener)
        if not self._listeners:
            raise OSError(f"cannot listen on loopback port {port}")

    def start(self) -> None:
        for listener in self._listeners:
            serve_each(listener, self._serve, "ivralo-relay")

    def close(self) -> None:
        """Stop listening (the supervisor's relay lives as long as the sandbox; a test's, less)."""
        for listener in self._listeners:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                listener.close()

    def _serve(self, conn: socket.socket) -> None:
        """One connection; whatever the client sent, never a traceback on the kernel's stderr."""
        try:
            self._serve_one(conn)
        except Exception as exc:  # noqa: BLE001 - a connection's failure is that connection's alone
            with contextlib.suppress(OSError):
                text = f"ivralo relay: the request could not be served ({type(exc).__name__})"
                conn.sendall(response(500, "Internal Server Error", text))
            with contextlib.suppress(OSError):
                conn.close()

    def _serve_one(self, conn: socket.socket) -> None:
        try:
            head, rest = read_head(conn)
            request = parse_head(head)
        except (BadRequest, OSError) as exc:
            with contextlib.suppress(OSError):
                conn.sendall(response(400, "Bad Request", f"ivralo relay: {exc}"))
            with contextlib.suppress(OSError):
                conn.close()
            return
        local = self._inside(request.host, request.port)
        if local is not None:
            first = TUNNEL_ESTABLISHED if request.tunnel else b""
            with contextlib.suppress(OSError):
                conn.sendall(first) if first else local.sendall(request.origin_head())
                if rest:
                    local.sendall(rest)
            splice(conn, local)
            return
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(self.upstream)
            # The connection itself goes to the host, which judges the request and answers the client
            # directly: no byte of it passes through this process again.
            hand_over(upstream, conn, head + rest)
        except OSError as exc:
            with contextlib.suppress(OSError):
                text = f"ivralo relay: the host's egress proxy is not answering ({exc.strerror or exc})"
                conn.sendall(response(502, "Bad Gateway", text))
            return
        finally:
            for s in (upstream, conn):
                with contextlib.suppress(OSError):
                    s.close()

    def _inside(self, host: str, port: int) -> socket.socket | None:
        """A connection to a server inside the sandbox on that port, if the request means one."""
        if not self.inside_shortcut or not is_loopback(host) or port == self.port:
            return None
        for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            s = socket.socket(family, socket.SOCK_STREAM)
            s.settimeout(LOCAL_CONNECT_TIMEOUT_S)
            try:
                s.connect((address, port))
            except OSError:
                s.close()
                continue
            s.settimeout(None)
            return s
        return None


def bind_relay(port_text: str | None, upstream: str | None, *, sandboxed: bool) -> Relay | None:
    """The relay's listeners, bound (no thread yet: the kernel is forked after this) when the host
    gave us an egress socket; None without one, or if it cannot listen (said on stderr)."""
    if not port_text or not upstream:
        return None
    try:
        return Relay(int(port_text), upstream, inside_shortcut=sandboxed)
    except (OSError, ValueError) as exc:
        print(f"ivralo supervisor: cannot start the egress relay: {exc}", file=sys.stderr)
        return None
