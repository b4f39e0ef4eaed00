"""[host] Serving ``mcp_server``'s tools over stdio or streamable HTTP, and ending every kernel
tree the server started when it stops: on stdin's end, on SIGTERM/SIGINT/SIGHUP, and, over HTTP,
when a client's session ends (its DELETE, or the SDK's idle timeout)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator

import anyio
from mcp.server import MCPServer
from mcp.server.stdio import stdio_server

from ivralo_kernel.host import Session
from ivralo_kernel.host.agent.mcp_questions import QuestionDesk
from ivralo_kernel.host.agent.mcp_server import HTTP_STATELESS_KEY, ClientSessions, build_server
from ivralo_kernel.host.agent.mcp_stdio import loop_stdio, pipes_can_serve

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
SESSION_SWEEP_S = 0.5  # how soon a session whose HTTP client left has its kernel ended


async def _closed(clients: ClientSessions) -> None:
    with anyio.CancelScope(shield=True):
        await clients.close_all()


async def serve_stdio(make_session: Callable[[QuestionDesk], Session]) -> None:
    server, clients = build_server(make_session, "stdio")
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task[None]] = []

    async def stop() -> None:
        await _closed(clients)
        # Not a cancellation of the serving task: the SDK's stdin reader is a thread blocked in
        # read(), which nothing wakes, and the serving task group (and the interpreter's exit)
        # would wait for it forever. Every kernel tree has ended by now.
        sys.stderr.flush()
        os._exit(0)

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, lambda: stopping.append(asyncio.ensure_future(stop())))
    try:
        await _run_stdio(server)  # returns at stdin's end: the client is gone
    finally:
        await _closed(clients)


async def _run_stdio(server: MCPServer) -> None:
    """The SDK's stdio transport and Server, on loop streams (``mcp_stdio.py``) where stdin and stdout
    can be: no thread hop per line read or written."""
    if not pipes_can_serve():
        await server.run_stdio_async()
        return
    lowlevel = server._lowlevel_server  # the SDK's run_stdio_async does the same, with its own streams
    async with loop_stdio() as (stdin, stdout), stdio_server(stdin, stdout) as (read_stream, write_stream):  # type: ignore[arg-type]
        await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())


async def serve_http(make_session: Callable[[QuestionDesk], Session], host: str, port: int) -> None:
    import uvicorn

    server, clients = build_server(make_session, "http")
    app = server.streamable_http_app(host=host)

    class Quiet(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:  # ours below: the kernels end before the server
            yield

    web = Quiet(uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5))
    loop = asyncio.get_running_loop()

    async def stop() -> None:
        await _closed(clients)  # the calls in flight return their loss at once
        web.should_exit = True

    stopping: list[asyncio.Task[None]] = []
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, lambda: stopping.append(asyncio.ensure_future(stop())))

    async def sweep() -> None:
        """A session whose client is gone (the SDK forgot its id) has its kernel ended."""
        while True:
            await asyncio.sleep(SESSION_SWEEP_S)
            live = set(getattr(server.session_manager, "_server_instances", {}))
            for key in clients.keys():
                if key != HTTP_STATELESS_KEY and key not in live:
                    await clients.close(key)

    async def announce() -> None:
        while not web.started:
            await asyncio.sleep(0.02)
        bound = web.servers[0].sockets[0].getsockname() if web.servers else (host, port)
        print(f"ivralo-kernel mcp: streamable HTTP at http://{bound[0]}:{bound[1]}/mcp", file=sys.stderr, flush=True)

    sweeper, announcer = asyncio.ensure_future(sweep()), asyncio.ensure_future(announce())
    try:
        await web.serve()
    finally:
        sweeper.cancel()
        announcer.cancel()
        await _closed(clients)
