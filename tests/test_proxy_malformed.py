"""Malformed requests to the host's egress proxy and to the sandbox's relay in front of it: garbage,
a head larger than the cap, bad ports, NUL bytes, escape sequences, a bracket left open. Each gets a
``400`` that says what was wrong; nothing is decided, nothing is connected, and no traceback reaches
the host's log or stderr. A well-formed request afterwards is still served (judged by the answer).

Both run here in the test's own process, as the host and the supervisor run them (threads on a unix
socket and on a loopback port); no request leaves loopback, and none is allowed anywhere.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import free_port

from ivralo_kernel.host.sandbox.egress_proxy import EgressProxy, Verdict
from ivralo_kernel.protocol.network.proxying import MAX_HEAD_BYTES
from ivralo_kernel.supervisor.relay import Relay

pytestmark = pytest.mark.fast  # threads and sockets only, no process

MALFORMED = {
    "garbage": b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n",
    "not three words": b"GET\r\n\r\n",
    "lower-case version": b"GET http://localhost:1/ http/1.1\r\n\r\n",
    "not ascii": "GET http://bücher.example/ HTTP/1.1\r\n\r\n".encode(),
    "NUL in the host": b"CONNECT local\x00host:80 HTTP/1.1\r\n\r\n",
    "NUL in the URL": b"GET http://local\x00host:80/ HTTP/1.1\r\n\r\n",
    "escape in the host": b"CONNECT \x1b]0;owned\x07:443 HTTP/1.1\r\n\r\n",
    "CSI in the URL": b"GET http://a\x1b[2J.example/ HTTP/1.1\r\n\r\n",
    "port too large (CONNECT)": b"CONNECT localhost:99999 HTTP/1.1\r\n\r\n",
    "port too large (URL)": b"GET http://localhost:99999/ HTTP/1.1\r\n\r\n",
    "port zero": b"CONNECT localhost:0 HTTP/1.1\r\n\r\n",
    "port not a number": b"GET http://localhost:http/ HTTP/1.1\r\n\r\n",
    "CONNECT without a port": b"CONNECT localhost HTTP/1.1\r\n\r\n",
    "negative port": b"CONNECT localhost:-1 HTTP/1.1\r\n\r\n",
    "bracket left open": b"GET http://[::1/ HTTP/1.1\r\n\r\n",
    "not an address in brackets": b"GET http://[zz]/ HTTP/1.1\r\n\r\n",
    "https in a plain request": b"GET https://localhost/ HTTP/1.1\r\n\r\n",
    "relative target": b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
    "empty host": b"CONNECT :443 HTTP/1.1\r\n\r\n",
    "a host with a space": b"GET http://a%20b/ HTTP/1.1\r\n\r\n",
    "no DNS name ends in a number": b"CONNECT 256.1.1.1:80 HTTP/1.1\r\n\r\n",
    "oversized head": b"GET http://localhost:1/ HTTP/1.1\r\nX: " + b"a" * (MAX_HEAD_BYTES + 10) + b"\r\n\r\n",
    "oversized, never ends": b"GET http://localhost:1/ HTTP/1.1\r\nX: " + b"a" * (3 * MAX_HEAD_BYTES),
    "closed before the head ended": b"GET http://localhost:1/ HTTP/1.1\r\n",
}


class Trouble(logging.Handler):
    """What the host would have logged, and every exception a thread let go of."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.uncaught: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record) + ("" if record.exc_info is None else " (with a traceback)"))


@pytest.fixture
def trouble(monkeypatch: pytest.MonkeyPatch) -> Iterator[Trouble]:
    handler = Trouble()
    root = logging.getLogger()
    root.addHandler(handler)
    monkeypatch.setattr(threading, "excepthook", lambda args: handler.uncaught.append(repr(args.exc_value)))
    try:
        yield handler
    finally:
        root.removeHandler(handler)


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[tuple[EgressProxy, list[tuple[str, int]]]]:
    asked: list[tuple[str, int]] = []

    def decide(host: str, port: int) -> Verdict:
        asked.append((host, port))
        return Verdict(False, "nobody to ask")

    server = EgressProxy(str(tmp_path / "egress.sock"), decide)
    server.start()
    try:
        yield server, asked
    finally:
        server.close()


def exchange(address: str | tuple[str, int], data: bytes) -> bytes:
    family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(20)
        s.connect(address)
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:  # the server answered and closed before it read it all (the oversized heads)
            pass
        answer = b""
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
        return answer


def assert_clean_400(answer: bytes, trouble: Trouble, case: str) -> None:
    status, _, rest = answer.partition(b"\r\n")
    assert status == b"HTTP/1.1 400 Bad Request", (case, answer[:300])
    body = rest.partition(b"\r\n\r\n")[2].decode()
    assert body.startswith(("ivralo egress proxy: ", "ivralo relay: ")) and len(body) < 400, (case, body)
    assert not any(ord(c) < 0x20 and c != "\n" for c in body), f"{case}: the answer echoes a control byte: {body!r}"
    assert trouble.uncaught == [], (case, trouble.uncaught)
    assert not [line for line in trouble.lines if "Traceback" in line or "traceback" in line], trouble.lines


@pytest.mark.parametrize("case", MALFORMED)
def test_the_proxy_answers_a_malformed_request_with_a_400(
    proxy: tuple[EgressProxy, list[tuple[str, int]]], trouble: Trouble, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    server, asked = proxy
    answer = exchange(server.path, MALFORMED[case])
    assert_clean_400(answer, trouble, case)
    assert asked == [], "nothing malformed is decided (or asked about)"
    assert "Traceback" not in capsys.readouterr().err
    # Still serving: a well-formed request is decided (and refused: nobody to ask).
    answer = exchange(server.path, b"GET http://localhost:1/ HTTP/1.1\r\nHost: localhost\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 403 Forbidden by ivralo: localhost refused (nobody to ask)"), answer[:200]
    assert asked == [("localhost", 1)]


@pytest.mark.parametrize("case", MALFORMED)
def test_the_relay_answers_a_malformed_request_with_a_400(
    proxy: tuple[EgressProxy, list[tuple[str, int]]], trouble: Trouble, case: str, capsys: pytest.CaptureFixture[str]
) -> None:
    server, asked = proxy
    relay = Relay(free_port(), server.path)
    relay.start()
    try:
        answer = exchange(("127.0.0.1", relay.port), MALFORMED[case])
        assert_clean_400(answer, trouble, case)
        assert asked == []
        assert "Traceback" not in capsys.readouterr().err
        answer = exchange(("127.0.0.1", relay.port), b"CONNECT 2130706433:1 HTTP/1.1\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 403 Forbidden by ivralo: 2130706433 refused"), answer[:200]
        assert asked == [("2130706433", 1)]
    finally:
        relay.close()


def test_a_head_that_never_comes_is_answered_in_time(
    proxy: tuple[EgressProxy, list[tuple[str, int]]], trouble: Trouble, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection that sends half a head and waits holds no thread for ever."""
    from ivralo_kernel.protocol.network import proxying

    monkeypatch.setattr(proxying, "HEAD_TIMEOUT_S", 0.5)
    server, asked = proxy
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(20)
        s.connect(server.path)
        s.sendall(b"GET http://localhost:1/ HTTP/1.1\r\n")
        answer = s.recv(65536)
    assert answer.startswith(b"HTTP/1.1 400 Bad Request"), answer
    assert b"no complete request head within" in answer
    assert asked == [] and trouble.uncaught == []


if sys.platform != "linux":  # pragma: no cover - the sandbox is Linux's
    pytest.skip("Linux only", allow_module_level=True)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def hand(path: str, fds: list[int], data: bytes) -> bytes:
    """Connect to the proxy's unix socket as the relay does, hand it ``fds`` with ``data``; its answer on
    the unix connection (empty when it answered on the descriptor handed over instead)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(20)
        s.connect(path)
        socket.send_fds(s, [data], fds)
        s.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
        return answer


def test_what_is_handed_to_the_proxy_is_served_only_if_it_is_a_stream_socket(
    proxy: tuple[EgressProxy, list[tuple[str, int]]], trouble: Trouble
) -> None:
    """The relay hands the host the client's connection itself (SCM_RIGHTS). Code in the sandbox can
    reach the same unix socket and hand it anything: a pipe, a datagram socket, several descriptors,
    a length that lies. Each is a 400 on the unix connection, nothing is decided, and the host keeps
    no descriptor it was given; a stream socket is answered on that socket, and judged as ever."""
    server, asked = proxy
    head = b"GET http://localhost:1/ HTTP/1.1\r\nHost: localhost\r\n\r\n"
    framed = struct.pack("!I", len(head)) + head
    before = open_fds()
    r, w = os.pipe()
    datagram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    a, b = socket.socketpair()
    try:
        for case, fds, data in (
            ("a pipe", [r], framed),
            ("a datagram socket", [datagram.fileno()], framed),
            ("a length that lies", [a.fileno()], struct.pack("!I", len(head) - 5) + head),
            ("a length beyond the cap", [a.fileno()], struct.pack("!I", 1 << 30) + head),
        ):
            assert_clean_400(hand(server.path, fds, data), trouble, case)
        assert asked == [], "nothing handed over badly is decided"
        # A stream socket, with a second descriptor that must be closed unread: served on the socket.
        assert hand(server.path, [a.fileno(), w], framed) == b""
        a.close()  # the proxy's copy is the last: its close ends the answer
        b.settimeout(20)
        answer = b""
        while chunk := b.recv(65536):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 403 Forbidden by ivralo: localhost refused (nobody to ask)"), answer[:200]
        assert asked == [("localhost", 1)]
    finally:
        for fd in (r, w):
            os.close(fd)
        for s in (datagram, a, b):
            s.close()
    deadline = time.monotonic() + 10
    while open_fds() != before and time.monotonic() < deadline:
        time.sleep(0.01)  # the serving thread closes its copies just after answering
    assert open_fds() == before, "the proxy kept a descriptor it was handed"


def test_one_thread_splices_both_ways_at_once_and_ends_with_both() -> None:
    """The splice moves both ways on one thread: 8 MiB each way at the same time (more than any
    socket buffer, so a loop that blocked on one way would stop the other), and a half-close each
    side (the end of a request body, then of the response) ends it, with every byte through."""
    from ivralo_kernel.protocol.network.proxying import splice

    size = 8 << 20
    payload = {"a": os.urandom(size), "b": os.urandom(size)}
    a_out, a_in = socket.socketpair()
    b_out, b_in = socket.socketpair()
    got: dict[str, bytes] = {}

    def send(s: socket.socket, data: bytes) -> None:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)

    def receive(s: socket.socket, key: str) -> None:
        chunks = []
        while chunk := s.recv(1 << 16):
            chunks.append(chunk)
        got[key] = b"".join(chunks)

    threads = [
        threading.Thread(target=splice, args=(a_in, b_in), daemon=True),
        threading.Thread(target=send, args=(a_out, payload["a"]), daemon=True),
        threading.Thread(target=send, args=(b_out, payload["b"]), daemon=True),
        threading.Thread(target=receive, args=(b_out, "a"), daemon=True),  # what a sent arrives at b
        threading.Thread(target=receive, args=(a_out, "b"), daemon=True),
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads), "the splice stalled"
        assert got == payload, {k: len(v) for k, v in got.items()}
        assert a_in.fileno() == -1 and b_in.fileno() == -1, "the splice closes both of its sockets"
    finally:
        for s in (a_out, b_out, a_in, b_in):
            s.close()
