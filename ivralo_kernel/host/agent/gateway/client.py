"""[host] The gateway's websocket, as the client side of one kernel's channels (``GatewayClient``).

jupyter_server's JSON protocol, binary frames when a message has buffers (``encode_binary``); replies
routed to their waiters, IOPub and shell to queues read as jupyter_client's ``get_*_msg`` are, the
host's egress question at the input prompt answered with the session's ``ask``; and the data plane's
bytes in ``CHUNK_BYTES`` pieces (jupyter_server refuses websocket messages over 10 MiB). Owned by a
``GatewayWorker`` (host/agent/gateway/worker.py), which it calls back through ``ClientOwner``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import queue
import re
import struct
import uuid
from typing import Any, Protocol

from tornado.websocket import WebSocketClientConnection

from ivralo_kernel.host.agent.dataplane import (
    TransferRefusedError,
    checked_size,
    decode_segment,
    ipc_bytes,
    kernel_json,
)
from ivralo_kernel.host.agent.kernel_worker import Asker, Transfer
from ivralo_kernel.host.off_loop import off_loop
from ivralo_kernel.protocol import IvraloError, names

CHUNK_BYTES = 4 << 20
PROTOCOL_VERSION = "5.4"
# The host's egress question at the input prompt (host/sandbox/person_question.py's ``prompt_text``).
_EGRESS_PROMPT = re.compile(r"^(?P<question>.*)\. Allow\? \[(?P<choices>[a-z/]+)\] $", re.S)


class ClientOwner(Protocol):
    """What the client calls back of its ``GatewayWorker``."""

    base: str
    asker: Asker | None

    def gone(self, why: str) -> None: ...

    def pause(self, on: bool) -> None: ...

    def deadline_for(self, msg_id: str) -> None: ...


class GatewayError(IvraloError):
    """The gateway refused a request, or is not there."""


def encode_binary(msg: dict[str, Any]) -> bytes:
    """jupyter_server's binary websocket message: the offsets, the JSON message, then its buffers."""
    buffers = [json.dumps({k: v for k, v in msg.items() if k != "buffers"}).encode(), *msg["buffers"]]
    offsets = [4 * (len(buffers) + 1)]
    for buf in buffers[:-1]:
        offsets.append(offsets[-1] + len(buf))
    return b"".join([struct.pack(f"!{len(buffers) + 1}I", len(buffers), *offsets), *buffers])


def decode_binary(data: bytes) -> dict[str, Any]:
    count = struct.unpack("!I", data[:4])[0]
    offsets = [*struct.unpack(f"!{count}I", data[4 : 4 * (count + 1)]), len(data)]
    view = memoryview(data)
    msg: dict[str, Any] = json.loads(bytes(view[offsets[0] : offsets[1]]))
    msg["buffers"] = [view[offsets[i] : offsets[i + 1]] for i in range(1, count)]
    return msg


class GatewayClient:
    """One kernel's websocket: the calls ``Session`` makes of jupyter_client's ``AsyncKernelClient``."""

    def __init__(self, worker: ClientOwner, ws: WebSocketClientConnection) -> None:
        self._worker, self._ws = worker, ws
        self.session = uuid.uuid4().hex
        self.iopub: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.shell: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}  # control/kernel_info replies
        self._collecting: dict[str, list[memoryview]] = {}  # comm_id -> the data plane's buffers
        self.collected = asyncio.Event()
        self._answering: set[asyncio.Task[None]] = set()
        self.closed = False
        self._reader = asyncio.create_task(self._read())

    def message(
        self, msg_type: str, content: dict[str, Any], channel: str, buffers: list[Any] | None = None
    ) -> dict[str, Any]:
        header = {
            "msg_id": uuid.uuid4().hex,
            "msg_type": msg_type,
            "username": "ivralo",
            "session": self.session,
            "version": PROTOCOL_VERSION,
            "date": datetime.datetime.now(datetime.UTC).isoformat(),
        }
        return {
            "header": header,
            "parent_header": {},
            "metadata": {},
            "content": content,
            "channel": channel,
            "buffers": buffers or [],
        }

    def send(self, msg: dict[str, Any]) -> str:
        if self.closed:
            raise GatewayError(f"the websocket to the gateway {self._worker.base} is closed")
        data: str | bytes = encode_binary(msg) if msg["buffers"] else json.dumps(msg)
        self._ws.write_message(data, binary=isinstance(data, bytes))
        return str(msg["header"]["msg_id"])

    async def request(self, msg_type: str, content: dict[str, Any], channel: str, timeout: float) -> dict[str, Any]:
        msg = self.message(msg_type, content, channel)
        waiter = self._waiting[msg["header"]["msg_id"]] = asyncio.get_running_loop().create_future()
        self.send(msg)
        try:
            return await asyncio.wait_for(waiter, timeout)
        finally:
            self._waiting.pop(msg["header"]["msg_id"], None)

    def execute(
        self,
        code: str,
        silent: bool = False,
        store_history: bool = True,
        user_expressions: dict[str, str] | None = None,
        allow_stdin: bool | None = None,
        stop_on_error: bool = True,
    ) -> str:
        content = {
            "code": code,
            "silent": silent,
            "store_history": store_history,
            "user_expressions": user_expressions or {},
            # Only the egress questions are answered at the prompt, and only with an ``ask`` to answer them.
            "allow_stdin": not silent and self._worker.asker is not None,
            "stop_on_error": stop_on_error,
        }
        msg_id = self.send(self.message("execute_request", content, "shell"))
        if not silent:
            self._worker.deadline_for(msg_id)
        return msg_id

    async def get_iopub_msg(self, timeout: float | None = None) -> dict[str, Any]:
        return await _get(self.iopub, timeout)

    async def get_shell_msg(self, timeout: float | None = None) -> dict[str, Any]:
        return await _get(self.shell, timeout)

    def collect(self, comm_id: str) -> list[memoryview]:
        """The buffers the kernel will send on ``comm_id`` (the data plane), kept off the IOPub queue."""
        return self._collecting.setdefault(comm_id, [])

    def stop_collecting(self, comm_id: str) -> None:
        self._collecting.pop(comm_id, None)

    async def _read(self) -> None:
        try:
            while True:
                data = await self._ws.read_message()
                if data is None:
                    return
                msg = decode_binary(data) if isinstance(data, bytes) else json.loads(data)
                self._route(msg)
        finally:
            self.closed = True
            self._worker.gone("the websocket to the gateway closed")

    def _route(self, msg: dict[str, Any]) -> None:
        channel, msg_type = msg.get("channel"), msg["header"]["msg_type"]
        parent_id = (msg.get("parent_header") or {}).get("msg_id")
        waiter = self._waiting.get(parent_id) if parent_id else None
        if waiter is not None and msg_type.endswith("_reply") and not waiter.done():
            waiter.set_result(msg)
            return
        if channel == "iopub":
            content = msg.get("content") or {}
            if msg_type == "comm_msg" and content.get("comm_id") in self._collecting:
                self._collecting[content["comm_id"]].extend(msg.get("buffers") or [])
                self.collected.set()
                return
            if msg_type == "status" and content.get("execution_state") in ("restarting", "dead"):
                self._worker.gone(f"the gateway reports the kernel {content['execution_state']}")
            self.iopub.put_nowait(msg)
        elif channel == "shell":
            self.shell.put_nowait(msg)
        elif channel == "stdin" and msg_type == "input_request":
            task = asyncio.create_task(self._answer_input(msg))
            self._answering.add(task)
            task.add_done_callback(self._answering.discard)

    async def _answer_input(self, msg: dict[str, Any]) -> None:
        """An input prompt: the guard's egress question goes to ``ask``; any other prompt gets "" (an
        agent has no keyboard)."""
        prompt = str((msg.get("content") or {}).get("prompt", ""))
        match = _EGRESS_PROMPT.match(prompt)
        answer = ""
        asker = self._worker.asker
        if match is not None and asker is not None:
            choices = tuple(match["choices"].split("/"))
            self._worker.pause(True)
            try:
                answer = await asker(match["question"], choices)
            except Exception:  # noqa: BLE001 - a failing callback is a "no", never a hang
                answer = "no"
            finally:
                self._worker.pause(False)
        reply = self.message("input_reply", {"value": answer}, "stdin")
        reply["parent_header"] = msg["header"]
        with contextlib.suppress(GatewayError):
            self.send(reply)

    def close(self) -> None:
        self._ws.close()
        self._reader.cancel()


async def _get(q: asyncio.Queue[dict[str, Any]], timeout: float | None) -> dict[str, Any]:
    if not timeout:
        try:
            return q.get_nowait() if timeout == 0 else await q.get()
        except asyncio.QueueEmpty:
            raise queue.Empty from None
    try:
        return await asyncio.wait_for(q.get(), timeout)
    except TimeoutError:
        raise queue.Empty from None


# --- the data plane over the websocket ------------------------------------------------------------


async def fetch_remote(kc: GatewayClient, call: Transfer, envelope: dict[str, Any], cap: int, why: str) -> Any:
    """Step two of ``get_var``/``get_dataframe`` behind a gateway: the kernel sends the prepared bytes
    as the buffers of ``comm_msg``s on IOPub (a comm id of ours, which no comm of the kernel has).
    What the kernel declares is checked against ``cap`` before the host waits for any of it."""
    checked_size(call.operation, envelope, "size", cap, why)
    comm_id = f"ivralo-data-{uuid.uuid4().hex}"
    buffers = kc.collect(comm_id)
    try:
        sent = kernel_json(call.operation, await call.value(f"{names.DATAPLANE_NAME}.send({comm_id!r}, {CHUNK_BYTES})"))
        size = checked_size(call.operation, sent, "size", cap, why)
        chunks = checked_size(call.operation, sent, "chunks", size // CHUNK_BYTES + 1, "its size in chunks")
        while len(buffers) < chunks:  # IOPub may trail the shell reply
            if sum(len(b) for b in buffers) > size:
                break  # more than it declared: refused below, without waiting for the rest
            kc.collected.clear()
            if len(buffers) >= chunks:
                break
            if call.left_s() <= 0:
                raise call.timeout()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(kc.collected.wait(), call.left_s())
        data = bytearray().join(buffers)
    finally:
        kc.stop_collecting(comm_id)
    if len(data) != size:
        raise TransferRefusedError(f"{call.operation}: the kernel said {size} bytes and {len(data)} came")
    return await off_loop(decode_segment, envelope, data, len(data))


async def inject_remote(kc: GatewayClient, call: Transfer, name: str, table: Any, kind: str) -> None:
    """``inject_dataframe`` behind a gateway: the Arrow IPC stream as ``ivralo_data_chunk`` messages on
    shell (handled in order, before the request that binds it)."""
    data = await off_loop(ipc_bytes, table)
    ref = uuid.uuid4().hex
    view = memoryview(data)
    for start in range(0, max(len(view), 1), CHUNK_BYTES):
        chunk = kc.message(names.MSG_DATA_CHUNK, {"ref": ref}, "shell", [view[start : start + CHUNK_BYTES]])
        kc.send(chunk)
    await call.value(f"{names.DATAPLANE_NAME}.receive_sent({name!r}, {ref!r}, {len(view)}, {kind!r})")
