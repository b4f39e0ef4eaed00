"""The channel relay between a sandboxed kernel's ipc sockets and its clients, with plain ZMQ sockets
on both sides (the kernel's side is a ROUTER, as ipykernel's shell is).

A client whose routing identity is already taken (jupyter_server names a kernel connection's shell
socket after the websocket's session id, and JupyterLab reconnects with the same one) takes it over,
as with ipykernel's own ROUTERs: before, the first peer kept it and the newcomer's requests were never
read, which left JupyterLab's kernel "Unknown" behind a Kernel Gateway (tests/test_gateway.py).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from ivralo_kernel.host.sandbox.channel_relay import SHELL_AND_STDIN_IDENTITY, ChannelRelay
from ivralo_kernel.protocol.processes import channel_url

pytestmark = pytest.mark.fast  # threads and ipc sockets, no process
CHANNELS = ("shell", "stdin", "control", "hb", "iopub")


def ipc_info(base: Path) -> dict[str, Any]:
    return {"transport": "ipc", "ip": str(base), **{f"{c}_port": n for n, c in enumerate(CHANNELS, 1)}}


def receive(socket: zmq.Socket[Any], deadline: float) -> list[bytes] | None:
    """The next message on ``socket``, or None once the deadline has passed."""
    remaining_ms = int((deadline - time.monotonic()) * 1000)
    if remaining_ms > 0 and socket.poll(remaining_ms):
        return socket.recv_multipart()
    return None


@pytest.mark.parametrize("channel", ["shell", "control"])
def test_a_client_reusing_a_routing_identity_takes_it_over(tmp_path: Path, channel: str) -> None:
    clients, kernel_side = ipc_info(tmp_path / "clients"), ipc_info(tmp_path / "kernel")
    context = zmq.Context()
    context.setsockopt(zmq.LINGER, 0)
    kernel = context.socket(zmq.ROUTER)
    kernel.bind(channel_url(kernel_side, channel))
    relay = ChannelRelay(clients, kernel_side)
    relay.start()
    try:
        deadline = time.monotonic() + 10
        identity = b"browser-session-id"
        stale = context.socket(zmq.DEALER)
        stale.setsockopt(zmq.IDENTITY, identity)
        stale.connect(channel_url(clients, channel))
        stale.send(b"first")
        first = receive(kernel, deadline)  # the first peer is attached: its request got through
        assert first is not None and first[-2:] == [identity, b"first"], first
        # The same identity again, while the first socket stays open (as lab's orphaned one does).
        live = context.socket(zmq.DEALER)
        live.setsockopt(zmq.IDENTITY, identity)
        live.connect(channel_url(clients, channel))
        live.send(b"second")
        request = receive(kernel, deadline)
        assert request is not None and request[-1] == b"second", "the newcomer's request was not read"
        kernel.send_multipart([*request[:-1], b"reply"])  # back along the envelope it came with
        assert receive(live, deadline) == [b"reply"]
        assert receive(stale, time.monotonic() + 0.2) is None
        if channel == "shell":
            assert request[0] == SHELL_AND_STDIN_IDENTITY
    finally:
        relay.close()
        context.destroy(linger=0)


def test_the_relay_connects_to_each_channel_once_the_kernel_binds_it(tmp_path: Path) -> None:
    """Started before the kernel (as at every launch): a client's request waits in the relay and
    reaches the kernel once it binds, without libzmq retrying a missing socket file meanwhile."""
    clients, kernel_side = ipc_info(tmp_path / "clients"), ipc_info(tmp_path / "kernel")
    context = zmq.Context()
    context.setsockopt(zmq.LINGER, 0)
    relay = ChannelRelay(clients, kernel_side)
    relay.start()
    try:
        deadline = time.monotonic() + 10
        client = context.socket(zmq.DEALER)
        client.connect(channel_url(clients, "control"))
        client.send(b"early")
        kernel = context.socket(zmq.ROUTER)
        kernel.bind(channel_url(kernel_side, "control"))  # only now does the kernel's file exist
        request = receive(kernel, deadline)
        assert request is not None and request[-1] == b"early", request
        kernel.send_multipart([*request[:-1], b"reply"])
        assert receive(client, deadline) == [b"reply"]
    finally:
        relay.close()
        context.destroy(linger=0)


def test_a_relay_whose_kernel_never_bound_closes_at_once(tmp_path: Path) -> None:
    """A kernel that died before binding: close() must not wait on sockets no thread took."""
    relay = ChannelRelay(ipc_info(tmp_path / "clients"), ipc_info(tmp_path / "kernel"))
    relay.start()
    t0 = time.monotonic()
    relay.close()
    assert time.monotonic() - t0 < 2


class Asking:
    """A relay that watches requests, a stand-in kernel (ROUTERs on shell and stdin, as
    ipykernel's) and one client (DEALERs with its session id as identity, as jupyter_client's)."""

    def __init__(self, base: Path) -> None:
        from jupyter_client.session import Session

        self.clients, self.kernel_side = ipc_info(base / "clients"), ipc_info(base / "kernel")
        self.clients |= {"key": "the-clients-key", "signature_scheme": "hmac-sha256"}
        self.session = Session(key=b"the-clients-key")
        self.context = zmq.Context()
        self.context.setsockopt(zmq.LINGER, 0)
        self.sockets: list[zmq.Socket[Any]] = []  # the clients', closed at the end
        self.kernel = {c: self.context.socket(zmq.ROUTER) for c in ("shell", "stdin")}
        for channel, socket in self.kernel.items():
            socket.bind(channel_url(self.kernel_side, channel))
        self.relay = ChannelRelay(self.clients, self.kernel_side, watch_requests=True)
        self.relay.start()
        self.client = self.connect(self.session.bsession)
        self.deadline = time.monotonic() + 10

    def connect(self, identity: bytes) -> dict[str, zmq.Socket[Any]]:
        sockets = {c: self.context.socket(zmq.DEALER) for c in ("shell", "stdin")}
        for channel, socket in sockets.items():
            socket.setsockopt(zmq.IDENTITY, identity)
            socket.connect(channel_url(self.clients, channel))
        self.sockets.extend(sockets.values())
        return sockets

    def execute(self, allow_stdin: bool = True) -> dict[str, Any]:
        request = self.session.msg("execute_request", {"code": "", "silent": False, "allow_stdin": allow_stdin})
        self.session.send(self.client["shell"], request)
        assert receive(self.kernel["shell"], self.deadline) is not None, "the request never reached the kernel"
        return request

    def ask(self, execution: str) -> tuple[list[str | None], threading.Thread]:
        box: list[str | None] = []
        thread = threading.Thread(target=lambda: box.append(self.relay.ask(execution, "Allow? [yes/no] ", 10)))
        thread.start()
        return box, thread

    def question(self) -> dict[str, Any]:
        frames = receive(self.client["stdin"], self.deadline)
        assert frames is not None, "no question reached the client"
        _, message = self.session.feed_identities(frames)
        return self.session.deserialize(message)  # the signature checks with the clients' key

    def kernel_gets_next_on_stdin(self) -> bytes:
        """What the kernel's stdin gets next: a marker the client sends now comes after whatever
        the relay passed on before it (one socket, in order)."""
        self.client["stdin"].send(b"marker")
        frames = receive(self.kernel["stdin"], self.deadline)
        assert frames is not None
        return frames[-1]

    def close(self) -> None:
        self.relay.close()
        for socket in [*self.sockets, *self.kernel.values()]:
            socket.close(linger=0)
        self.context.term()


@pytest.fixture
def asking(tmp_path: Path) -> Any:
    setup = Asking(tmp_path)
    yield setup
    setup.close()


@pytest.mark.parametrize("parented", [True, False])
def test_the_hosts_question_reaches_the_client_and_its_answer_never_the_kernel(asking: Any, parented: bool) -> None:
    request = asking.execute()
    box, thread = asking.ask(request["header"]["msg_id"])
    question = asking.question()
    assert question["msg_type"] == "input_request" and question["content"]["prompt"] == "Allow? [yes/no] "
    assert question["parent_header"]["msg_id"] == request["header"]["msg_id"]  # the client's own request
    reply = asking.session.msg("input_reply", {"value": "yes"}, parent=question if parented else None)
    asking.session.send(asking.client["stdin"], reply)
    thread.join(10)
    assert box == ["yes"]
    assert asking.kernel_gets_next_on_stdin() == b"marker"  # the answer did not reach the kernel


def test_a_reply_that_does_not_verify_answers_nothing_and_reaches_nobody(asking: Any) -> None:
    from jupyter_client.session import Session

    request = asking.execute()
    box, thread = asking.ask(request["header"]["msg_id"])
    question = asking.question()
    forger = Session(key=b"another-key", session=asking.session.session)
    forger.send(asking.client["stdin"], forger.msg("input_reply", {"value": "always"}, parent=question))
    assert asking.kernel_gets_next_on_stdin() == b"marker"  # dropped, and not passed on either
    assert box == []
    asking.session.send(asking.client["stdin"], asking.session.msg("input_reply", {"value": "no"}, parent=question))
    thread.join(10)
    assert box == ["no"]


def test_another_peer_cannot_answer_the_clients_question(asking: Any) -> None:
    request = asking.execute()
    box, thread = asking.ask(request["header"]["msg_id"])
    question = asking.question()
    other = asking.connect(b"someone-else")
    asking.session.send(other["stdin"], asking.session.msg("input_reply", {"value": "always"}, parent=question))
    frames = receive(asking.kernel["stdin"], asking.deadline)  # not the host's: passed on, as any reply
    assert frames is not None and b"someone-else" in frames
    assert box == []
    asking.session.send(asking.client["stdin"], asking.session.msg("input_reply", {"value": "no"}, parent=question))
    thread.join(10)
    assert box == ["no"]


def test_nobody_is_asked_without_stdin_or_a_running_request(asking: Any) -> None:
    request = asking.execute(allow_stdin=False)
    assert asking.relay.ask(request["header"]["msg_id"], "Allow? ", 10) is None
    assert asking.relay.ask("an-execution-no-client-sent", "Allow? ", 10) is None
    assert receive(asking.client["stdin"], time.monotonic() + 0.2) is None


def test_the_executions_end_ends_its_question_and_a_late_answer_is_nobodys(asking: Any) -> None:
    request = asking.execute()
    box, thread = asking.ask(request["header"]["msg_id"])
    asking.question()
    # The kernel's execute_reply, back to the client along the request's envelope.
    reply = asking.session.msg("execute_reply", {"status": "ok"}, parent=request)
    asking.session.send(asking.kernel["shell"], reply, ident=[SHELL_AND_STDIN_IDENTITY, asking.session.bsession])
    thread.join(10)
    assert box == [None]
    asking.session.send(asking.client["stdin"], asking.session.msg("input_reply", {"value": "yes"}))
    assert asking.kernel_gets_next_on_stdin() == b"marker"  # the late answer went to nobody


def test_a_client_without_a_stdin_connection_is_nobody_to_ask(asking: Any) -> None:
    """``allow_stdin`` true, but no stdin socket with the client's identity: no, at once."""
    from jupyter_client.session import Session

    lone = Session(key=b"the-clients-key")
    shell = asking.context.socket(zmq.DEALER)
    asking.sockets.append(shell)
    shell.setsockopt(zmq.IDENTITY, lone.bsession)
    shell.connect(channel_url(asking.clients, "shell"))
    request = lone.msg("execute_request", {"code": "", "silent": False, "allow_stdin": True})
    lone.send(shell, request)
    assert receive(asking.kernel["shell"], asking.deadline) is not None
    started = time.monotonic()
    assert asking.relay.ask(request["header"]["msg_id"], "Allow? ", 10) is None
    assert time.monotonic() - started < 5, "it waited for an answer nobody could give"


def test_the_proxy_checks_the_address_it_reached_before_a_byte_goes_up(tmp_path: Path) -> None:
    """An allowed name that reaches a closed address (a name resolved differently at connect than
    when it was judged): 403, and the listener there reads nothing but the connection's end."""
    import socket

    from ivralo_kernel.host.sandbox.egress_proxy import EgressProxy, Verdict

    listener = socket.create_server(("127.0.0.1", 0))
    closed_port = listener.getsockname()[1]
    proxy = EgressProxy(
        str(tmp_path / "proxy.sock"),
        lambda host, port: Verdict(True, "allowed here"),
        lambda peer: "closed for the test" if peer[1] == closed_port else None,
    )
    proxy.start()
    try:
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(10)
            conn.connect(proxy.path)
            conn.sendall(f"CONNECT localhost:{closed_port} HTTP/1.1\r\nHost: localhost\r\n\r\nsecret".encode())
            answer = conn.recv(4096)
        assert answer.startswith(b"HTTP/1.1 403 Forbidden by ivralo"), answer
        assert b"closed for the test" in answer
        listener.settimeout(10)
        upstream, _ = listener.accept()
        with upstream:
            upstream.settimeout(10)
            assert upstream.recv(100) == b""  # closed without a byte of the client's
        assert proxy.decisions == [("localhost", closed_port, False)]
    finally:
        proxy.close()
        listener.close()
