"""[kernel] Ask the host something from inside a running cell, and wait for its answer.

Requests and answers travel on the broker's socket: the kernel's end of a socketpair the host made
at launch (``IVRALO_BROKER_FD``; protocol/broker_frames.py), whose other end only the host holds.
A reader thread delivers each answer to the request waiting for it; the wait is an
``Event.wait``, which an interrupt ends at once. Nothing of it passes through Jupyter's channels, so
no client holding the connection key (nor code here, which holds it too) can answer in the host's name.

No request leaves before the host's ``ivralo_broker_hello`` has arrived on control: the host sends it
once its IOPub subscription is live, and it binds each request to an execution it saw start there.
A request made earlier waits for the hello (bounded).
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any, cast

from ivralo_kernel.protocol import broker_frames
from ivralo_kernel.protocol.messages import BrokerAnswer, BrokerRequest, CallRecord


class BrokerUnavailable(RuntimeError):
    """No ivralo host is attached to answer."""


NO_HOST = (
    "no ivralo host is attached to this kernel to answer (it was started without one: VS Code and "
    "other raw launches run kernel.json's command directly). Run it under an ivralo host: JupyterLab, "
    "jupyter console or any jupyter_client host with the ivralo kernelspec, or ivralo_kernel.host.Session"
)
HOST_GONE = "the ivralo host that started this kernel closed its broker socket (it exited); restart the kernel"
CONTROL_THREAD = "Control"  # ipykernel's control-channel thread, which delivers the host's hello
HOST_CONNECT_TIMEOUT_S = 30.0  # how long a request waits for the host's hello before giving up
READ_CHUNK = 1 << 20


class BrokerClient:
    def __init__(self) -> None:
        self.comm_id: str | None = None  # set at launch when a host started this kernel
        self._socket: socket.socket | None = None  # our end of the broker's socketpair (``take_socket``)
        self._send_lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self._gone = False  # the host closed its end
        # The msg_id of the request running now (set by the kernel once it is built).
        self.parent_of: Callable[[], str | None] | None = None
        self.host_ready = threading.Event()
        # Called around a wait: the deadline backstop stops counting while the host (or a person) answers.
        self.on_wait: tuple[Callable[[], None], Callable[[], None]] | None = None
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[threading.Event, list[BrokerAnswer]]] = {}
        self.records: list[CallRecord] = []  # the host's record of each call it made, this execution
        self._on_host_ready: list[Callable[[], None]] = []

    def take_records(self) -> list[CallRecord]:
        records, self.records = self.records, []
        return records

    @property
    def attached(self) -> bool:
        return self.comm_id is not None and self._socket is not None and self.parent_of is not None

    def take_socket(self, fd_text: str) -> None:
        """(at launch) Our end of the broker's socketpair, under a descriptor of our own that no
        process this kernel starts inherits (a child holding it would keep it open after we exit)."""
        try:
            given = int(fd_text)
            fd = os.dup(given)  # not inheritable
            os.close(given)
            self._socket = socket.socket(fileno=fd)
        except (ValueError, OSError):
            self._socket = None

    def _start_reader(self, sock: socket.socket) -> None:
        with self._lock:
            if self._reader is None:
                self._reader = threading.Thread(target=self._read, args=(sock,), name="ivralo-broker", daemon=True)
                self._reader.start()

    def _read(self, sock: socket.socket) -> None:
        """(the reader thread) Each answer to the request that waits for it, until the host's end closes."""
        frames = broker_frames.FrameReader(broker_frames.MAX_ANSWER_BYTES)
        while True:
            try:
                chunk = sock.recv(READ_CHUNK)
            except InterruptedError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                break
            for frame in frames.feed(chunk):
                if isinstance(frame, dict):
                    self.deliver(frame)
        with self._lock:
            self._gone = True
            waiting = list(self._pending.values())
        for event, box in waiting:  # nobody will answer them: they end now, not at their timeout
            box.append(BrokerAnswer(ok=False, allowed=False, error=HOST_GONE, reason=HOST_GONE))
            event.set()

    def _send(self, sock: socket.socket, request: BrokerRequest) -> None:
        frame = broker_frames.encode(request)
        with self._send_lock:
            sock.sendall(frame)

    def hello(self, comm_id: object) -> bool:
        """(Control thread) The host hears this kernel's IOPub and reaches its control channel."""
        if comm_id is None or comm_id != self.comm_id:
            return False
        with self._lock:
            self.host_ready.set()
            waiting, self._on_host_ready = self._on_host_ready, []
        for callback in waiting:
            callback()
        return True

    def when_host_ready(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from the control thread, or now) once the host's hello has come."""
        with self._lock:
            if not self.host_ready.is_set():
                self._on_host_ready.append(callback)
                return
        callback()

    def _wait_for_host(self) -> None:
        if self.host_ready.wait(HOST_CONNECT_TIMEOUT_S):
            return
        raise BrokerUnavailable(
            f"the ivralo host that started this kernel has not connected to its broker channel within "
            f"{HOST_CONNECT_TIMEOUT_S:g} s (its process may have ended or be overloaded); restart the kernel"
        )

    def ask(
        self, kind: str, payload: Mapping[str, Any], timeout: float, *, pause_deadline: bool = False
    ) -> BrokerAnswer:
        """Send a request and wait for its answer. ``pause_deadline``: somebody may be asked, whose
        time does not count against the cell's deadline."""
        sock, parent_of = self._socket, self.parent_of
        if self.comm_id is None or sock is None or parent_of is None:
            raise BrokerUnavailable(NO_HOST)
        if threading.current_thread().name == CONTROL_THREAD:
            # The answer arrives on this very thread: waiting here would never end (the debugger
            # runs code while Control waits for it).
            raise BrokerUnavailable("a request from the kernel's Control thread cannot wait for the host's answer")
        self._wait_for_host()
        self._start_reader(sock)
        req_id = uuid.uuid4().hex
        event = threading.Event()
        box: list[BrokerAnswer] = []
        with self._lock:
            if self._gone:
                raise BrokerUnavailable(HOST_GONE)
            self._pending[req_id] = (event, box)
        try:
            # Sent as given: the host checks every payload (code in the kernel can send anything).
            request = BrokerRequest(
                req_id=req_id, kind=kind, payload=cast("dict[str, Any]", payload), parent=parent_of()
            )
            try:
                self._send(sock, request)
            except OSError as exc:
                raise BrokerUnavailable(f"{HOST_GONE} ({exc.strerror or exc})") from None
            pauses = self.on_wait if pause_deadline else None
            if pauses is not None:
                pauses[0]()
            try:
                if not event.wait(timeout):
                    raise TimeoutError(f"the ivralo host did not answer a {kind} request within {timeout:g} s")
            finally:
                if pauses is not None:
                    pauses[1]()
            return box[0]
        finally:
            with self._lock:
                self._pending.pop(req_id, None)

    def deliver(self, content: Mapping[str, Any]) -> None:
        """(the reader thread) An answer arrived: ``{"req_id", "answer"}``."""
        with self._lock:
            waiting = self._pending.get(str(content.get("req_id")))
        if waiting is not None:
            event, box = waiting
            answer = content.get("answer")
            box.append(cast(BrokerAnswer, dict(answer)) if isinstance(answer, dict) else BrokerAnswer())
            event.set()


# One per kernel process: the network guard (installed before ipykernel) and the kernel share it.
BROKER = BrokerClient()
