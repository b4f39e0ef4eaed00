"""[host] One kernel's egress proxy: the sandbox's only way to the network.

It listens on a unix socket in the kernel's runtime folder (the relay inside the sandbox hands it
every connection) and serves HTTP ``CONNECT`` and plain HTTP requests in absolute form. Each
``host:port`` is decided first, by the host's egress policy (``decide``: the allow list, then an
agent's ``ask`` or the person at the running cell); only after a yes is the name resolved and
connected. A refused name is never looked up. A refusal is a ``403`` whose status line and body say
why and what to do, which curl, pip and requests show.

A verdict carries ``recorded``: it blocks until the decision is where it must be before the client
hears back (the running cell's "hosts tried" line, see ``egress_notes``). The proxy calls it as late
as it can, after connecting and sending the request upstream, so the wait overlaps the upstream's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ivralo_kernel.protocol.network.egress import ALLOW_LIST
from ivralo_kernel.protocol.network.egress_names import Target, normalize
from ivralo_kernel.protocol.network.proxying import (
    TUNNEL_ESTABLISHED,
    BadRequest,
    ProxyRequest,
    handed_over,
    parse_head,
    read_head,
    response,
    serve_each,
    splice,
)
from ivralo_kernel.protocol.terminal import terminal_safe


def _nothing_to_wait_for() -> None:
    pass


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str
    recorded: Callable[[], None] = field(default=_nothing_to_wait_for)


Decide = Callable[[str, int], Verdict]
# The address a connection reached -> why it must not be used, or None. Checked after the connect,
# before a byte goes up: a name that resolves to this machine is caught as well as its literal.
ClosedPeer = Callable[[tuple[Any, ...]], str | None]
CONNECT_TIMEOUT_S = 15.0
log = logging.getLogger(__name__)


class EgressProxy:
    def __init__(self, path: str, decide: Decide, closed_peer: ClosedPeer | None = None) -> None:
        self.path, self._decide, self.closed_peer = path, decide, closed_peer
        self.decisions: list[tuple[str, int, bool]] = []  # (host, port, allowed), for doctor and tests
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self._listener.bind(path)
        os.chmod(path, 0o600)
        self._listener.listen(64)
        self._closed = False

    def redirect(self, decide: Decide) -> None:
        """A new decider: the provisioner that adopted a spare kernel decides for its proxy now."""
        self._decide = decide

    def start(self) -> None:
        serve_each(self._listener, self._serve, "ivralo-egress")

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    def _serve(self, conn: socket.socket) -> None:
        """One connection, from its head to its end. Whatever the client sent, it gets an answer and
        the host's log a line at most: never a traceback (the bytes are the kernel's to choose)."""
        try:
            try:
                conn, data = handed_over(conn)
            except (BadRequest, OSError) as exc:
                self._answer(conn, 400, "Bad Request", f"ivralo egress proxy: {exc}")
                return
            self._serve_one(conn, data)
        except Exception as exc:  # noqa: BLE001 - a connection's failure is that connection's alone
            log.warning("ivralo egress proxy: a connection failed (%s)", terminal_safe(f"{type(exc).__name__}: {exc}"))
            self._answer(conn, 500, "Internal Server Error", "ivralo egress proxy: the request could not be served")

    def _serve_one(self, conn: socket.socket, data: bytes = b"") -> None:
        try:
            head, rest = read_head(conn, data)
            request = parse_head(head)
        except (BadRequest, OSError) as exc:
            self._answer(conn, 400, "Bad Request", f"ivralo egress proxy: {exc}")
            return
        try:
            verdict = self._decide(request.host, request.port)
        except Exception as exc:  # noqa: BLE001 - a failing decision is a refusal, never a hang
            log.warning("ivralo: deciding %s:%s failed: %s", request.host, request.port, terminal_safe(str(exc)))
            verdict = Verdict(False, "the host could not decide")
        self.decisions.append((request.host, request.port, verdict.allowed))
        if not verdict.allowed:
            verdict.recorded()
            # The status line carries the reason: it is what urllib, requests and pip show.
            status = f"Forbidden by ivralo: {request.host} refused ({_one_line(verdict.reason)})"
            self._answer(conn, 403, status, refusal_text(request, verdict.reason))
            return
        try:  # resolved only now, after the decision; to what the name means, as it was judged
            target = normalize(request.host)
            addresses = _resolve(target.host, request.port)
            surprise = _surprise(target, addresses) if verdict.reason != ALLOW_LIST else None
            if surprise is not None:
                verdict.recorded()
                why = f"{request.host} resolves to {surprise}, which the question did not name"
                status = f"Forbidden by ivralo: {request.host} refused ({why})"
                text = (
                    f"ivralo refused {request.host}:{request.port}: {why}. A name that DNS points at this "
                    f"machine or your network is reached only when hosts.allow (.ivralo/permissions.json) "
                    f"names it, or by its address, which the question then names."
                )
                self._answer(conn, 403, status, text)
                return
            upstream = _connect(addresses, request.port)
            closed = self.closed_peer(upstream.getpeername()) if self.closed_peer is not None else None
        except (OSError, ValueError) as exc:
            verdict.recorded()
            why = getattr(exc, "strerror", None) or str(exc)
            text = f"ivralo egress proxy: allowed, but {request.host}:{request.port} cannot be reached: {why}"
            self._answer(conn, 502, "Bad Gateway", text)
            return
        if closed is not None:
            upstream.close()
            verdict.recorded()
            self.decisions[-1] = (request.host, request.port, False)
            status = f"Forbidden by ivralo: {request.host}:{request.port} refused ({closed})"
            self._answer(conn, 403, status, f"ivralo refused {request.host}:{request.port}: {closed}.")
            return
        try:
            # The client's bytes go up at once; nothing comes back to it before the decision is noted.
            if not request.tunnel:
                upstream.sendall(request.origin_head())
            if rest:
                upstream.sendall(rest)
            verdict.recorded()
            if request.tunnel:
                conn.sendall(TUNNEL_ESTABLISHED)
        except OSError:
            for s in (conn, upstream):
                s.close()
            return
        splice(conn, upstream)

    @staticmethod
    def _answer(conn: socket.socket, status: int, reason: str, text: str) -> None:
        with contextlib.suppress(OSError):
            conn.sendall(response(status, reason, text))
        with contextlib.suppress(OSError):
            conn.close()


def _resolve(host: str, port: int) -> list[str]:
    """The addresses a name has now, once: the connection goes to these, never to a second lookup
    (which a rebinding DNS server could answer otherwise)."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(sockaddr[0]) for *_, sockaddr in found))


def _surprise(target: Target, addresses: list[str]) -> str | None:
    """A public name that points at this machine or the person's network (``127.0.0.1.nip.io``, a
    rebinding domain): the person was asked about the name, not about that place."""
    if target.local:
        return None
    for address in addresses:
        place = normalize(address)
        if place.local:
            return f"{place.host} ({place.place})"
    return None


def _connect(addresses: list[str], port: int) -> socket.socket:
    error: OSError = OSError("the name has no address")
    for address in addresses:
        try:
            upstream = socket.create_connection((address, port), timeout=CONNECT_TIMEOUT_S)
        except OSError as exc:
            error = exc
            continue
        upstream.settimeout(None)
        return upstream
    raise error


def _one_line(text: str) -> str:
    return " ".join(text.split())[:200]


def refusal_text(request: ProxyRequest, reason: str) -> str:
    return (
        f"ivralo refused {request.host}:{request.port} ({reason}). The kernel reaches the network only "
        f"through ivralo's host, which asks about hosts it does not know; add the host to hosts.allow "
        f"(.ivralo/permissions.json) or answer 'yes' when asked."
    )
