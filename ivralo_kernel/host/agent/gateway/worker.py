"""[host] ``Session(gateway_url=...)``: the kernel runs behind a Jupyter Kernel Gateway.

The gateway starts the ``ivralo`` kernelspec, so the ivralo provisioner runs in the gateway's
process: it holds the credentials and the grants, enforces memory, answers the broker and the egress
questions on the kernel's own sockets. The agent's side is a client: REST for start, interrupt,
restart and delete, one websocket (jupyter_server's JSON protocol, binary frames when a message has
buffers) for shell, IOPub, control and stdin (host/agent/gateway/client.py).

``GatewayWorker`` is a ``KernelWorker`` (host/agent/kernel_worker.py), as a local ``Worker`` is (``kc.execute``,
``kc.get_iopub_msg``/``get_shell_msg`` raising ``queue.Empty``, ``watchdog``, ``outcome``, ``is_alive``,
``kill``), so the session's call loop, result building and lost-variables message are the same code:

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
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import httpx
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from ivralo_kernel.host.agent.gateway.client import (  # noqa: F401 - its names, kept where other code finds them
    CHUNK_BYTES,
    GatewayClient,
    GatewayError,
    decode_binary,
    encode_binary,
    fetch_remote,
    inject_remote,
)
from ivralo_kernel.host.agent.kernel_worker import Asker, KernelWorker, Transfer
from ivralo_kernel.host.agent.worker import WorkerSettings
from ivralo_kernel.host.settings.config import WorkerConfig
from ivralo_kernel.host.watch.escalation import Phase
from ivralo_kernel.host.watch.outcome import Outcome, Outcomes
from ivralo_kernel.protocol import ConfigError, WorkerBootstrapError, names

if TYPE_CHECKING:
    from ivralo_kernel.host.history.ledger import HistoryRecorder

TOKEN_ENV = "JUPYTER_GATEWAY_AUTH_TOKEN"  # noqa: S105 - a variable name, not a value; jupyter_server's own variable for GatewayClient.auth_token
READY_TIMEOUT_S = 60.0
MAX_FRAME_BYTES = 64 << 20  # what we accept in one websocket message (our chunks are far smaller)


def split_url(gateway_url: str) -> tuple[str, str]:
    """(the gateway's base URL, its token): from ``?token=`` in the URL, else ``JUPYTER_GATEWAY_AUTH_TOKEN``."""
    parts = urlsplit(gateway_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError("gateway_url", f"{gateway_url!r} is not an http(s) URL", "Give e.g. http://host:8888")
    query = parse_qs(parts.query)
    token = (query.pop("token", None) or [os.environ.get(TOKEN_ENV, "")])[0]
    base = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), urlencode(query, doseq=True), ""))
    return base, token


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

    def cgroup_cause(self) -> str | None:
        """A gateway's kernel runs in the gateway's cgroup, never one of this host's: none to read."""
        return None

    def take_soft_notice(self) -> str | None:
        return None


class GatewayWorker:
    """A kernel the gateway runs, as a ``KernelWorker``. Its deadline is timed here (``_enforce``),
    against the call's ``Outcome``: the reply ends the wait, the deadline's restart is a loss."""

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
        self.outcomes = Outcomes()  # the gateway's own watchdog watches the tree: a reply is never held
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
            self.outcomes.renew()
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
        self.outcomes.lose_all(why)

    def outcome(self, msg_id: str) -> Outcome:
        return self.outcomes.of(msg_id)

    def take_session(self, grants: frozenset[str], ask: Asker | None, on_asking: Callable[[bool], None]) -> None:
        """The gateway's configuration holds the grants; its questions come at the prompt, to ``ask``."""
        if ask is None:
            self.asker = None
            return

        async def asking(question: str, choices: tuple[str, ...]) -> str:
            on_asking(True)
            try:
                return str(await ask(question, choices))
            finally:  # the person's time does not count against the call's deadline
                on_asking(False)

        self.asker = asking

    def history_recorder(self) -> HistoryRecorder | None:
        return None  # the kernel's history is kept on the gateway's machine

    def held_segment(self) -> None:
        return None  # no shared memory: the bytes come over the websocket

    async def fetch(self, call: Transfer, envelope: dict[str, Any], cap: int, why: str) -> Any:
        return await fetch_remote(self.kc, call, envelope, cap, why)

    async def inject(self, call: Transfer, name: str, table: Any, kind: str, size: int) -> None:
        await inject_remote(self.kc, call, name, table, kind)

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

    async def _until(self, start: float, budget_s: float, outcome: Outcome) -> bool:
        """Wait until ``budget_s`` past ``start`` (paused time excluded); False if the call ended first.
        It wakes at that time, or at the outcome; a pause moves the time on, so it waits again."""
        while not outcome.done:
            paused = self._paused_s + (time.monotonic() - self._paused_since if self._paused_since else 0.0)
            left = start + budget_s + paused - time.monotonic()
            if left <= 0:
                return True
            with contextlib.suppress(TimeoutError):
                await outcome.wait(left)
        return False

    async def _enforce(self, msg_id: str, deadline_ms: int) -> None:
        start, self._paused_s = time.monotonic(), 0.0
        outcome = self.outcome(msg_id)
        if not await self._until(start, deadline_ms / 1000, outcome):
            return
        self.watchdog._interrupted.add(msg_id)
        with contextlib.suppress(httpx.HTTPError, GatewayError):
            await self._post("interrupt")
        if not await self._until(start, (deadline_ms + self.config.interrupt_grace_ms) / 1000, outcome):
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

    async def release(self, given: KernelWorker) -> None:
        """A lost kernel is restarted through the gateway and kept for the next call; otherwise deleted."""
        worker = next((w for w in self._workers if w is given), None)  # one this pool gave out
        if worker is None:
            await given.stop()
            return
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

    def note_tables(self) -> None:
        """(``WorkerPool.note_tables``) No spares here to warm: one kernel at a time, started on demand."""

    async def interpreter(self) -> _Interpreter:
        return _Interpreter(f"the gateway's kernelspec {self.kernel_name!r} at {self.base}")

    async def close(self) -> None:
        self._spare = None
        for worker in list(self._workers):
            await self._forget(worker)
        await self._http.aclose()
