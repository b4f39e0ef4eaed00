"""[host] stdin and stdout as the MCP SDK's stdio transport reads and writes them, on the event loop.

The SDK's own ``stdio_server()`` wraps both in ``anyio.wrap_file``: every line read, every write
and every flush is a hop to a worker thread and back, three per tool call, which was most of what
the server added to ``run_python("1+1")`` (issue 28, Must 8). Here the same descriptors are asyncio
pipe transports, read and written on the loop itself; the SDK's ``stdio_server`` (its JSON-RPC
parsing and framing) and its ``Server`` are unchanged, given these two streams.

As the SDK does, fd 0 and fd 1 are diverted while serving (to the null device and to stderr), so a
child that inherits them cannot read the client's messages or write onto the wire.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

# One JSON-RPC message a line: a cell's code or a set_var value can be large.
MAX_LINE_BYTES = 256 * 1024 * 1024


class LoopStdin:
    """``async for line in stdin``, as the SDK's reader iterates it; ends at the client's EOF."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    def __aiter__(self) -> LoopStdin:
        return self

    async def __anext__(self) -> str:
        line = await self._reader.readline()
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")


class LoopStdout:
    """``await stdout.write(text)`` then ``await stdout.flush()``, as the SDK's writer calls them."""

    def __init__(self, transport: asyncio.WriteTransport, protocol: Any) -> None:
        self._writer = asyncio.StreamWriter(transport, protocol, None, asyncio.get_running_loop())

    async def write(self, text: str) -> None:
        self._writer.write(text.encode("utf-8"))

    async def flush(self) -> None:
        await self._writer.drain()  # waits only when the client reads slower than we write


def pipes_can_serve() -> bool:
    """asyncio's pipe transports take pipes, sockets and character devices; a regular file as stdin
    (``< file``) cannot be one, and then the SDK's own transport serves."""
    try:
        return all(not stat.S_ISREG(os.fstat(fd).st_mode) for fd in (0, 1))
    except OSError:
        return False


@asynccontextmanager
async def loop_stdio() -> AsyncIterator[tuple[LoopStdin, LoopStdout]]:
    """The process's stdin and stdout as loop streams, with fd 0 and 1 diverted while serving."""
    loop = asyncio.get_running_loop()
    wire_in, wire_out = os.dup(0), os.dup(1)
    null_in = os.open(os.devnull, os.O_RDONLY)
    saved_in, saved_out = os.dup(0), os.dup(1)
    os.dup2(null_in, 0)
    os.dup2(2, 1)
    os.close(null_in)
    reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
    read_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(wire_in, "rb", buffering=0)
    )
    write_transport, write_protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(wire_out, "wb", buffering=0)
    )
    try:
        yield LoopStdin(reader), LoopStdout(write_transport, write_protocol)
    finally:
        read_transport.close()
        write_transport.close()
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)
