"""The broker's HTTP client (host/broker/api_http.py) against a loopback server in a thread of this
process: kept-alive connections, a connection the server dropped, the response cap, and the request
an operation builds (where its parameters and its credential go). Judged by what the server saw."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ivralo_kernel.host.broker.api_http import ApiHttp, ApiRequest, ResponseTooLarge
from ivralo_kernel.host.broker.operations import parse_operation

pytestmark = pytest.mark.timeout(30)


@dataclass
class Seen:
    """What the server saw: one entry per connection, the request heads and bodies on it."""

    connections: list[list[tuple[str, bytes]]] = field(default_factory=list)


class LoopbackServer:
    """HTTP/1.1 on 127.0.0.1 that answers each request with its own head and body, as JSON.
    ``drop_second``: the second request on a connection is met by closing it, unanswered (what a
    server that timed an idle connection out does, seen from the client's side)."""

    def __init__(self, drop_second: bool = False, body_bytes: int = 0) -> None:
        self.seen = Seen()
        self.drop_second, self.body_bytes = drop_second, body_bytes
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.threads: list[threading.Thread] = []
        accept = threading.Thread(target=self._accept, daemon=True)
        accept.start()
        self.threads.append(accept)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            requests: list[tuple[str, bytes]] = []
            self.seen.connections.append(requests)
            thread = threading.Thread(target=self._serve, args=(conn, requests), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _serve(self, conn: socket.socket, requests: list[tuple[str, bytes]]) -> None:
        with contextlib.suppress(OSError):  # the client stopped reading (past its cap) and closed
            self._answer_each(conn, requests)

    def _answer_each(self, conn: socket.socket, requests: list[tuple[str, bytes]]) -> None:
        with conn, conn.makefile("rb") as reader:
            while True:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = reader.readline()
                    if not line:
                        return
                    head += line
                text = head.decode("latin-1")
                length = next(
                    (int(h.split(":", 1)[1]) for h in text.split("\r\n") if h.lower().startswith("content-length:")), 0
                )
                body = reader.read(length) if length else b""
                requests.append((text, body))
                if self.drop_second and len(requests) == 2:
                    return
                answer = json.dumps({"head": text, "body": body.decode()}).encode() + b" " * self.body_bytes
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n"
                    + f"Content-Length: {len(answer)}\r\n\r\n".encode()
                    + answer
                )

    def close(self) -> None:
        """After the client closed its connections: every thread of the server ends."""
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept()
        self.listener.close()
        for thread in self.threads:
            thread.join(timeout=10)
            assert not thread.is_alive(), f"the loopback server's {thread.name} did not end"


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    s = LoopbackServer()
    yield s
    s.close()


def get(port: int, path: str = "/a", method: str = "GET", body: bytes | None = None) -> ApiRequest:
    return ApiRequest(method, f"http://127.0.0.1:{port}{path}", {"User-Agent": "test"}, body)


@pytest.mark.fast
def test_calls_to_one_origin_share_one_kept_alive_connection(server: LoopbackServer) -> None:
    client = ApiHttp()
    try:
        for n in range(3):
            answer = client.send(get(server.port, f"/n{n}"), 5.0, 1 << 20)
            assert answer.status == 200 and json.loads(answer.text)["head"].startswith(f"GET /n{n} HTTP/1.1")
    finally:
        client.close()
    assert [len(requests) for requests in server.seen.connections] == [3]


@pytest.mark.fast
def test_a_dropped_connection_is_retried_for_a_get_only() -> None:
    server = LoopbackServer(drop_second=True)
    client = ApiHttp()
    try:
        client.send(get(server.port), 5.0, 1 << 20)
        # The second GET meets the closed connection; it goes again on a new one.
        assert client.send(get(server.port, "/again"), 5.0, 1 << 20).status == 200
        assert [len(r) for r in server.seen.connections] == [2, 1]
        # A POST is not sent twice: the server may have acted on it.
        client.send(get(server.port, "/third"), 5.0, 1 << 20)  # the new connection's second: dropped, retried
        with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
            client.send(get(server.port, "/post", method="POST", body=b"{}"), 5.0, 1 << 20)
    finally:
        client.close()
        server.close()
    assert [len(r) for r in server.seen.connections] == [2, 2, 2]


@pytest.mark.fast
def test_a_response_past_the_cap_is_refused_and_its_connection_is_not_reused() -> None:
    server = LoopbackServer(body_bytes=200_000)
    client = ApiHttp()
    try:
        with pytest.raises(ResponseTooLarge):
            client.send(get(server.port), 5.0, 100_000)
        assert len(client.send(get(server.port), 5.0, 1 << 20).content) > 200_000
    finally:
        client.close()
        server.close()
    assert len(server.seen.connections) == 2


@pytest.mark.fast
def test_an_operation_sends_its_parameters_and_credential_where_it_says(server: LoopbackServer) -> None:
    spec = {
        "url": f"http://127.0.0.1:{server.port}/items/{{id}}?format=json",
        "credential": "IVRALO_TEST_KEY",
        "auth": {"kind": "query", "name": "key"},
        "params": {"id": {"type": "string", "required": True}, "q": {"type": "string"}, "n": {"type": "boolean"}},
    }
    op = parse_operation("items.get", spec, "test")
    client = ApiHttp()
    try:
        sent = client.send(op.request(op.check({"id": "a b/é", "q": "x&y", "n": True}), "s3cret"), 5.0, 1 << 20)
        posted_op = parse_operation("items.add", {**spec, "method": "POST", "auth": {"kind": "bearer"}}, "test")
        posted = client.send(posted_op.request({"id": "1", "q": "é"}, "s3cret"), 5.0, 1 << 20)
    finally:
        client.close()
    line = json.loads(sent.text)["head"].split("\r\n")[0]
    # The URL's own query stays; the path's placeholder is encoded whole; the key goes last.
    assert line == "GET /items/a%20b%2F%C3%A9?format=json&q=x%26y&n=true&key=s3cret HTTP/1.1"
    seen = json.loads(posted.text)
    assert seen["head"].startswith("POST /items/1?format=json HTTP/1.1")
    assert "Authorization: Bearer s3cret" in seen["head"] and "Content-Type: application/json" in seen["head"]
    assert json.loads(seen["body"]) == {"q": "é"}


def test_an_https_api_whose_certificate_no_authority_signed_is_refused(tmp_path: Path) -> None:
    """HTTPS is verified (against certifi's bundle): a loopback server with a self-signed
    certificate for 127.0.0.1 gets no request, only a failed handshake. (Not fast: openssl makes
    the certificate.)"""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subject = ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-days", "1"]
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert), *subject],
        check=True,
        capture_output=True,
        timeout=20,
    )
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    heard: list[bytes] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with conn, contextlib.suppress(OSError):  # the client gives up in the handshake
            with tls.wrap_socket(conn, server_side=True) as secure:
                heard.append(secure.recv(65536))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = ApiHttp()
    try:
        with pytest.raises(ssl.SSLCertVerificationError):
            client.send(ApiRequest("GET", f"https://127.0.0.1:{port}/", {}), 5.0, 1 << 20)
    finally:
        client.close()
        thread.join(timeout=10)
        listener.close()
    assert not thread.is_alive() and heard == []
