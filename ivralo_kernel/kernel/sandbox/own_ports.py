"""[kernel] The loopback TCP ports the kernel's own links need in the fallback, fixed before Landlock.

In the fallback, Landlock's TCP rule lets the kernel's tree connect to the egress proxy's port only,
and a Landlock domain cannot be widened later. Two of ipykernel's own links are loopback TCP on a
port picked at run time: a forked child's output (the IOPub pipe) and the debugger (ipykernel
connects to debugpy). So their ports are picked here, before the rule: each is held by a bound
socket (nothing else on the machine can listen on it meanwhile) until its link binds it, and the
rule allows them. debugpy runs its adapter in the kernel's process (``in_process_debug_adapter``):
a separate adapter would connect to two more ports picked at run time.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

PIPE, DEBUGGER = "pipe", "debugger"
_held: dict[str, socket.socket] = {}
_reserved: list[int] = []


def reserve() -> tuple[int, ...]:
    """Hold one loopback port for each link; returns them (nothing held where binding fails)."""
    for link in (PIPE, DEBUGGER):
        holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Both the holder and the link's own listener (libzmq and pydevd set it too) may bind the port
        # while the other is bound and not listening: the hand-over needs no window with neither.
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            holder.bind(("127.0.0.1", 0))
        except OSError:
            holder.close()
            continue
        _held[link] = holder
        _reserved.append(holder.getsockname()[1])
    return reserved()


def reserved() -> tuple[int, ...]:
    """The ports reserved at the start (for the layer report), taken or not."""
    return tuple(_reserved)


def _take(link: str) -> tuple[int, socket.socket] | None:
    holder = _held.pop(link, None)
    return (holder.getsockname()[1], holder) if holder is not None else None


def install() -> None:
    """Give the IOPub pipe its port (before ipykernel's app builds it)."""
    if PIPE not in _held:
        return
    import zmq
    from ipykernel.iostream import IOPubThread

    original = IOPubThread._setup_pipe_in

    def _setup_pipe_in(self: Any) -> None:
        held = _take(PIPE)
        if held is None:
            return original(self)  # type: ignore[no-any-return]
        port, holder = held
        random_port = zmq.Socket.bind_to_random_port

        def bind_reserved(sock: Any, address: str, *_args: Any, **_kwargs: Any) -> int:
            sock.bind(f"{address}:{port}")
            holder.close()
            return port

        zmq.Socket.bind_to_random_port = bind_reserved  # type: ignore[method-assign,assignment]
        try:
            return original(self)  # type: ignore[no-any-return]
        finally:
            zmq.Socket.bind_to_random_port = random_port  # type: ignore[method-assign,assignment]

    IOPubThread._setup_pipe_in = _setup_pipe_in  # type: ignore[method-assign,assignment]


def debugger_built(debugger: Any) -> None:
    """(the first debug_request) ipykernel's debugger: debugpy on the held port, its adapter inside."""
    held = _take(DEBUGGER)
    if held is None:
        return
    port, holder = held
    import debugpy

    debugger.debugpy_client.debugpy_port = str(port)
    listen = debugpy.listen

    def listen_in_process(address: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(OSError):
            holder.close()
        kwargs.setdefault("in_process_debug_adapter", True)
        return listen(address, **kwargs)

    debugpy.listen = listen_in_process
