"""[host] The five Jupyter channels, relayed between a client's TCP ports and a sandboxed kernel's
``ipc`` sockets (a raw launch: VS Code chose the ports; the kernel lives in a network namespace of
its own, where a TCP port is out of its reach).

Each channel is a ``zmq.proxy`` on a thread of its own (libzmq moves the frames; Python is not in
the path). Routing identities survive the trip: a client's request reaches the kernel as
``[relay identity, client identity, <IDS|MSG>, ...]``, so the reply finds its way back by the same
frames. The shell and stdin relays share one identity towards the kernel: ipykernel sends a cell's
``input_request`` to the identities of the shell message that ran it, on the stdin socket, and the
first of them must be a peer of that socket too. IOPub is XPUB/XSUB, so a client's subscription
reaches the kernel (ipykernel greets each new subscriber with ``iopub_welcome``).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import zmq

# Towards the kernel, shell and stdin are one peer (see above).
SHELL_AND_STDIN_IDENTITY = b"ivralo-raw-launch"
# ipc sockets appear when the kernel binds them, a moment after it starts: retry often.
RECONNECT_IVL_MS = 10


def endpoint(info: dict[str, Any], channel: str) -> str:
    transport, ip, port = info.get("transport", "tcp"), info["ip"], info[f"{channel}_port"]
    return f"{transport}://{ip}:{port}" if transport == "tcp" else f"{transport}://{ip}-{port}"


class ChannelRelay:
    """Binds the client's side now (a client may connect before the kernel is up: its messages
    wait in the relay) and connects to the kernel's side, which appears when the kernel binds.
    The proxies run for the rest of the process's life."""

    def __init__(self, client_side: dict[str, Any], kernel_side: dict[str, Any]) -> None:
        self._context = zmq.Context()
        self._context.setsockopt(zmq.LINGER, 0)
        self._pairs: list[tuple[str, zmq.Socket[Any], zmq.Socket[Any]]] = []
        for channel, outer_type, inner_type in (
            ("shell", zmq.ROUTER, zmq.DEALER),
            ("stdin", zmq.ROUTER, zmq.DEALER),
            ("control", zmq.ROUTER, zmq.DEALER),
            ("hb", zmq.ROUTER, zmq.DEALER),
            ("iopub", zmq.XPUB, zmq.XSUB),
        ):
            outer = self._context.socket(outer_type)
            inner = self._context.socket(inner_type)
            if channel in ("shell", "stdin"):
                inner.setsockopt(zmq.IDENTITY, SHELL_AND_STDIN_IDENTITY)
            if channel == "iopub":
                outer.setsockopt(zmq.XPUB_VERBOSE, 1)  # every client's subscription, not only the first
            inner.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
            outer.bind(endpoint(client_side, channel))
            inner.connect(endpoint(kernel_side, channel))
            self._pairs.append((channel, outer, inner))

    def start(self) -> None:
        for channel, outer, inner in self._pairs:
            thread = threading.Thread(target=_proxy, args=(outer, inner), name=f"ivralo-relay-{channel}")
            thread.daemon = True
            thread.start()


def _proxy(outer: zmq.Socket[Any], inner: zmq.Socket[Any]) -> None:
    # Runs until the process ends: the raw launch's host exits (os._exit) when its kernel has ended.
    with contextlib.suppress(zmq.ZMQError):
        zmq.proxy(outer, inner)
