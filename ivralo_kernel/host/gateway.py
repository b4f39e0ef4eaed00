"""[host] ``Session(gateway_url=...)``: the kernel runs behind a Jupyter Kernel Gateway.

The gateway starts the ``ivralo`` kernelspec, so the ivralo provisioner runs in the gateway's
process: it holds the credentials and the grants, enforces memory, answers the broker and the egress
questions on the kernel's own sockets. The agent's side is a client: REST for start, interrupt,
restart and delete, one websocket (jupyter_server's JSON protocol, binary frames when a message has
buffers) for shell, IOPub, control and stdin.

``GatewayWorker`` has the surface ``Session`` uses of a local ``Worker`` (``kc.execute``,
``kc.get_iopub_msg``/``get_shell_msg`` raising ``queue.Empty``, ``watchdog``, ``is_alive``, ``kill``),
so the session's call loop, result building and lost-variables message are the same code:

* **Deadline** (the agent's ``WorkerConfig.deadline_ms``): at the deadline the kernel is interrupted
  (``POST .../interrupt``); a call that still has not ended after ``interrupt_grace_ms`` is lost: the
  kernel is restarted through the gateway (``POST .../restart``) and the session reports the lost
  variables. Time spent waiting for an ``ask`` answer does not count.
* **Egress questions**: the gateway has no agent callback, so its host asks "the person" at the
  cell's input prompt, on its own relay's stdin; this client answers that prompt (on stdin, over the
  websocket) with ``ask``.
* **Data plane**: no shared memory between the machines, so bulk bytes travel as binary buffers on
  the websocket, in ``CHUNK_BYTES`` pieces (jupyter_server refuses websocket messages over 10 MiB):
  kernel to host as ``comm_msg`` on IOPub, host to kernel as ``ivralo_data_chunk`` on shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import queue
import re
import struct
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import httpx
from tornado.httpclient import HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from ivralo_kernel.host.config import WorkerConfig
from ivralo_kernel.host.dataplane import TransferRefusedError, checked_size, decode_segment, ipc_bytes
from ivralo_kernel.host.escalation import Phase
from ivralo_kernel.host.off_loop import off_loop
from ivralo_kernel.host.worker import WorkerSettings
from ivralo_kernel.protocol import ConfigError, IvraloError, WorkerBootstrapError, names

if TYPE_CHECKING:
    from ivralo_kernel.host.namespace import NamespaceCall

TOKEN_ENV = "JUPYTER_GATEWAY_AUTH_TOKEN"  # noqa: S105 - a variable name, not a value; jupyter_server's own variable for GatewayClient.auth_token
CHUNK_BYTES = 4 << 20
PROTOCOL_VERSION = "5.4"
READY_TIMEOUT_S = 60.0
MAX_FRAME_BYTES = 64 << 20  # what we accept in one websocket message (our chunks are far smaller)
# The host's egress question at the input prompt (host/person_question.py's ``prompt_text``).
_EGRESS_PROMPT = re.compile(r"^(?P<question>.*)\. Allow\? \[(?P<choices>[a-z/]+)\] $", re.S)

Asker = Callable[[str, tuple[str, ...]], Awaitable[str]]


class GatewayError(IvraloError):
    """The gateway refused a request, or is not there."""


def split_url(gateway_url: str) -> tuple[str, str]:
    """(the gateway's base URL, its token): from ``?token=`` in the URL, else ``JUPYTER_GATEWAY_AUTH_TOKEN``."""
    parts = urlsplit(gateway_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError("gateway_url", f"{gateway_url!r} is not an http(s) URL", "Give e.g. http://host:8888")
    query = parse_qs(parts.query)
    token = (query.pop("token", None) or [os.environ.get(TOKEN_ENV, "")])[0]
    base = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), urlencode(query, doseq=True), ""))
    return base, token


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


@dataclass(frozen=True)
class GatewayLoss:
    cause: str
    observer: str
    msg_id: str | None


class _Observer:
    def __init__(self, where: str) -> None:
        self.where = where

    def describe(self) -> str:
        return f"the kernel runs behind the gateway {self.where}"


class RemoteDeadline:
    """What ``Session`` reads of a local ``Watchdog``, for a kernel the gateway runs."""

    def __init__(self, where: str) -> None:
        self.observer = _Observer(where)
        self.loss: GatewayLoss | None = None
        self._interrupted: set[str] = set()

    def interrupted(self, msg_id: str) -> bool:
        return msg_id in self._interrupted

    def settled(self, msg_id: str) -> bool:
        return True  # the gateway's own watchdog watches the tree; the reply is all we see

    def phase_of(self, msg_id: str) -> Phase:
        if self.loss is not None and self.loss.msg_id == msg_id:
            return Phase.KILLED
        return Phase.INTERRUPTED if msg_id in self._interrupted else Phase.FINISHED

    def take_soft_notice(self) -> str | None:
        return None


class GatewayClient:
    """One kernel's websocket: the calls ``Session`` makes of jupyter_client's ``AsyncKernelClient``."""

    def __init__(self, worker: GatewayWorker, ws: WebSocketClientConnection) -> None:
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
            if msg_type == "execute_reply":
                self._worker.replied(str(parent_id))
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


class GatewayWorker:
    """A kernel the gateway runs, with the ``Worker`` surface ``Session`` uses."""

    remote = True
    km = None  # no local provisioner: the gateway's holds the grants and the credentials
    exchange = None  # no shared memory: the data plane goes over the websocket

    def __init__(self, http: httpx.AsyncClient, base: str, token: str, kernel_id: str, config: WorkerConfig) -> None:
        self.http, self.base, self.token, self.kernel_id, self.config = http, base, token, kernel_id, config
        self.kernel_info: dict[str, Any] = {}
        self.last_used = time.monotonic()
        self.busy = False
        self.retired: str | None = None
        self.asker: Asker | None = None
        self.watchdog = RemoteDeadline(base)
        self.kc: GatewayClient
        self._dead: str | None = None
        self._replied: set[str] = set()
        self._timer: asyncio.Task[None] | None = None
        self._restart: asyncio.Task[None] | None = None
        self._paused_s = 0.0
        self._paused_since: float | None = None

    @property
    def url(self) -> str:
        return f"{self.base}/api/kernels/{self.kernel_id}"

    async def connect(self) -> None:
        ws_base = "ws" + self.base.removeprefix("http")
        request = HTTPRequest(
            f"{ws_base}/api/kernels/{self.kernel_id}/channels",
            headers={"Authorization": f"token {self.token}"} if self.token else {},
            connect_timeout=READY_TIMEOUT_S,
            request_timeout=READY_TIMEOUT_S,
        )
        ws = await websocket_connect(request, max_message_size=MAX_FRAME_BYTES)
        stream = getattr(ws.protocol, "stream", None)
        if stream is not None:  # small requests go out at once, not after the peer's delayed ACK (Nagle)
            stream.set_nodelay(True)
        self.kc = GatewayClient(self, ws)

    async def wait_ready(self, timeout_s: float) -> None:
        """Ready: the kernel's ``kernel_info_reply`` carries the ivralo section."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WorkerBootstrapError(
                    f"the gateway's kernel {self.kernel_id} at {self.base} did not answer as an ivralo kernel "
                    f"within {timeout_s:g} s; is the gateway's kernelspec {names.KERNEL_NAME!r} installed?"
                )
            try:
                reply = await self.kc.request("kernel_info_request", {}, "shell", min(left, 1.0))
            except TimeoutError:
                continue  # a kernel still starting does not see requests sent before it listened
            content = reply.get("content") or {}
            if not (content.get(names.KERNEL_INFO_SECTION) or {}).get("pid"):
                raise WorkerBootstrapError(
                    f"the gateway {self.base} started a kernel that is not an ivralo kernel (no ivralo section "
                    "in its kernel_info_reply)"
                )
            self.kernel_info = content
            self._dead = None
            self.watchdog.loss = None
            return

    @property
    def pid(self) -> int | None:
        """The kernel's pid on the gateway's machine."""
        pid = (self.kernel_info.get(names.KERNEL_INFO_SECTION) or {}).get("pid")
        return int(pid) if pid else None

    supervisor_pid = None

    def exit_status(self) -> None:
        return None

    async def is_alive(self) -> bool:
        return self._dead is None and not self.kc.closed

    def gone(self, why: str) -> None:
        if self._dead is None:
            self._dead = why

    def replied(self, msg_id: str) -> None:
        self._replied.add(msg_id)

    def pause(self, on: bool) -> None:
        """The time an ``ask`` answer takes does not count against the deadline."""
        if on:
            self._paused_since = time.monotonic()
        elif self._paused_since is not None:
            self._paused_s += time.monotonic() - self._paused_since
            self._paused_since = None

    def deadline_for(self, msg_id: str) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self.config.deadline_ms is not None:
            self._timer = asyncio.create_task(self._enforce(msg_id, self.config.deadline_ms))

    async def _until(self, start: float, budget_s: float, msg_id: str) -> bool:
        """Wait until ``budget_s`` past ``start`` (paused time excluded); False if the call ended first."""
        while msg_id not in self._replied:
            paused = self._paused_s + (time.monotonic() - self._paused_since if self._paused_since else 0.0)
            left = start + budget_s + paused - time.monotonic()
            if left <= 0:
                return True
            await asyncio.sleep(min(left, 0.05))  # the deadline's own clock, not a synchronisation
        return False

    async def _enforce(self, msg_id: str, deadline_ms: int) -> None:
        start, self._paused_s = time.monotonic(), 0.0
        if not await self._until(start, deadline_ms / 1000, msg_id):
            return
        self.watchdog._interrupted.add(msg_id)
        with contextlib.suppress(httpx.HTTPError, GatewayError):
            await self._post("interrupt")
        if not await self._until(start, (deadline_ms + self.config.interrupt_grace_ms) / 1000, msg_id):
            return
        cause = f"timeout: execution exceeded deadline_ms={deadline_ms}"
        self.watchdog.loss = GatewayLoss(cause, self.watchdog.observer.describe(), msg_id)
        self.gone(cause)
        self._restart = asyncio.create_task(self._post("restart"))

    async def _post(self, action: str) -> None:
        response = await self.http.post(f"{self.url}/{action}", json={})
        if response.status_code >= 300:
            raise GatewayError(f"{action} of kernel {self.kernel_id} at {self.base}: HTTP {response.status_code}")

    async def kill(self) -> None:
        """The user's Esc: the kernel is restarted now (its namespace goes), no grace."""
        self.gone("stopped by the user")
        if self._restart is None or self._restart.done():
            self._restart = asyncio.create_task(self._post("restart"))

    async def renew(self) -> None:
        """After a loss: the restart (ours, or the gateway's own) finished and the kernel answers again."""
        if self._timer is not None:
            self._timer.cancel()
        if self._restart is None:  # the gateway restarted it, or the loss was a crash: restart to be sure
            self._restart = asyncio.create_task(self._post("restart"))
        try:
            await self._restart
        finally:
            self._restart = None
        self._replied.clear()
        self.watchdog = RemoteDeadline(self.base)
        for q in (self.kc.iopub, self.kc.shell):  # what the old kernel sent answers nobody now
            while not q.empty():
                q.get_nowait()
        await self.wait_ready(self.config.bootstrap_timeout_ms / 1000)

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        with contextlib.suppress(AttributeError):
            self.kc.close()
        with contextlib.suppress(httpx.HTTPError):
            await self.http.delete(self.url)


@dataclass
class _Interpreter:
    description: str


class GatewayPool:
    """What ``Session`` uses of a ``WorkerPool``, for kernels a gateway runs: one at a time, restarted
    through the gateway's API after a loss, deleted on close."""

    def __init__(self, gateway_url: str, workspace: str, config: WorkerConfig | None, role: str | None) -> None:
        self.base, token = split_url(gateway_url)
        self.config = config or WorkerConfig()
        self.settings = WorkerSettings(os.path.realpath(workspace), self.config, role or names.ROLE_SPECIALIST)
        self.kernel_name = names.KERNEL_NAME
        headers = {"Authorization": f"token {token}"} if token else {}
        self._token = token
        self._http = httpx.AsyncClient(headers=headers, timeout=READY_TIMEOUT_S)
        self._spare: GatewayWorker | None = None
        self._workers: list[GatewayWorker] = []

    async def acquire(self) -> GatewayWorker:
        spare, self._spare = self._spare, None
        if spare is not None:
            return spare
        started = time.monotonic()
        try:
            response = await self._http.post(f"{self.base}/api/kernels", json={"name": self.kernel_name})
        except httpx.HTTPError as exc:
            raise WorkerBootstrapError(
                f"the gateway {self.base} did not answer ({exc}). Check that jupyter-kernel-gateway runs "
                "there and that gateway_url names its address and port"
            ) from None
        if response.status_code != 201:
            raise WorkerBootstrapError(
                f"the gateway {self.base} refused to start kernel {self.kernel_name!r}: HTTP {response.status_code} "
                f"{response.text[:300]}"
            )
        worker = GatewayWorker(self._http, self.base, self._token, response.json()["id"], self.config)
        self._workers.append(worker)
        try:
            await worker.connect()
            budget = self.config.bootstrap_timeout_ms / 1000
            await worker.wait_ready(max(1.0, budget - (time.monotonic() - started)))
        except BaseException:
            await self._forget(worker)
            raise
        return worker

    async def release(self, worker: GatewayWorker) -> None:
        """A lost kernel is restarted through the gateway and kept for the next call; otherwise deleted."""
        if not await worker.is_alive() and not worker.kc.closed and worker.retired is None:
            try:
                await worker.renew()
            except (GatewayError, WorkerBootstrapError, httpx.HTTPError):
                await self._forget(worker)
                return
            self._spare = worker
            return
        await self._forget(worker)

    async def _forget(self, worker: GatewayWorker) -> None:
        if worker in self._workers:
            self._workers.remove(worker)
        await worker.stop()

    async def interpreter(self) -> _Interpreter:
        return _Interpreter(f"the gateway's kernelspec {self.kernel_name!r} at {self.base}")

    async def close(self) -> None:
        self._spare = None
        for worker in list(self._workers):
            await self._forget(worker)
        await self._http.aclose()


# --- the data plane over the websocket ------------------------------------------------------------


async def fetch_remote(call: NamespaceCall, envelope: dict[str, Any], cap: int, why: str) -> Any:
    """Step two of ``get_var``/``get_dataframe`` behind a gateway: the kernel sends the prepared bytes
    as the buffers of ``comm_msg``s on IOPub (a comm id of ours, which no comm of the kernel has).
    What the kernel declares is checked against ``cap`` before the host waits for any of it."""
    worker = call.worker
    assert isinstance(worker, GatewayWorker)
    checked_size(call.operation, envelope, "size", cap, why)
    comm_id = f"ivralo-data-{uuid.uuid4().hex}"
    buffers = worker.kc.collect(comm_id)
    try:
        sent = json.loads(await call.value(f"{names.DATAPLANE_NAME}.send({comm_id!r}, {CHUNK_BYTES})"))
        size = checked_size(call.operation, sent, "size", cap, why)
        chunks = checked_size(call.operation, sent, "chunks", size // CHUNK_BYTES + 1, "its size in chunks")
        while len(buffers) < chunks:  # IOPub may trail the shell reply
            if sum(len(b) for b in buffers) > size:
                break  # more than it declared: refused below, without waiting for the rest
            worker.kc.collected.clear()
            if len(buffers) >= chunks:
                break
            if call.left_s() <= 0:
                raise call.timeout()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(worker.kc.collected.wait(), call.left_s())
        data = bytearray().join(buffers)
    finally:
        worker.kc.stop_collecting(comm_id)
    if len(data) != size:
        raise TransferRefusedError(f"{call.operation}: the kernel said {size} bytes and {len(data)} came")
    return await off_loop(decode_segment, envelope, data, len(data))


async def inject_remote(call: NamespaceCall, name: str, table: Any, kind: str) -> None:
    """``inject_dataframe`` behind a gateway: the Arrow IPC stream as ``ivralo_data_chunk`` messages on
    shell (handled in order, before the request that binds it)."""
    worker = call.worker
    assert isinstance(worker, GatewayWorker)
    data = await off_loop(ipc_bytes, table)
    ref = uuid.uuid4().hex
    view = memoryview(data)
    for start in range(0, max(len(view), 1), CHUNK_BYTES):
        chunk = worker.kc.message(names.MSG_DATA_CHUNK, {"ref": ref}, "shell", [view[start : start + CHUNK_BYTES]])
        worker.kc.send(chunk)
    await call.value(f"{names.DATAPLANE_NAME}.receive_sent({name!r}, {ref!r}, {len(view)}, {kind!r})")
