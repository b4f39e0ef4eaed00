"""The channel relay between a sandboxed kernel's ipc sockets and its clients, with plain ZMQ sockets
on both sides (the kernel's side is a ROUTER, as ipykernel's shell is).

A client whose routing identity is already taken (jupyter_server names a kernel connection's shell
socket after the websocket's session id, and JupyterLab reconnects with the same one) takes it over,
as with ipykernel's own ROUTERs: before, the first peer kept it and the newcomer's requests were never
read, which left JupyterLab's kernel "Unknown" behind a Kernel Gateway (tests/test_gateway.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from ivralo_kernel.host.channel_relay import SHELL_AND_STDIN_IDENTITY, ChannelRelay
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
