"""[kernel] Ask the host something from inside a running cell, and wait for its answer.

Requests go out as ``comm_msg`` on IOPub, on the broker comm whose id the host chose at launch
(``IVRALO_BROKER_COMM``); answers come back as the ``ivralo_broker_reply`` control message, which the
Control thread serves while a synchronous cell blocks (a reply on shell would wait until the cell
ends: a deadlock). The wait is an ``Event.wait``, which an interrupt ends at once.

No request leaves before the host's ``ivralo_broker_hello`` has arrived on control: the host sends it
once its IOPub subscription is live, so a request can neither fall into the gap before a slow
subscriber joins nor wait for an answer on a control connection that is not up yet. A request made
earlier waits for the hello (bounded).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any, cast

from ivralo_kernel.protocol.messages import BrokerAnswer, BrokerRequest, CallRecord


class BrokerUnavailable(RuntimeError):
    """No ivralo host is attached to answer."""


NO_HOST = (
    "no ivralo host is attached to this kernel to answer (it was started without one: VS Code and "
    "other raw launches run kernel.json's command directly). Run it under an ivralo host: JupyterLab, "
    "jupyter console or any jupyter_client host with the ivralo kernelspec, or ivralo_kernel.host.Session"
)
CONTROL_THREAD = "Control"  # ipykernel's control-channel thread, which delivers the host's answers
HOST_CONNECT_TIMEOUT_S = 30.0  # how long a request waits for the host's hello before giving up


class BrokerClient:
    def __init__(self) -> None:
        self.comm_id: str | None = None  # set at launch when a host started this kernel
        # Sends one comm_msg on IOPub (set by the kernel once it is built).
        self.publish: Callable[[str, BrokerRequest], None] | None = None
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
        return self.comm_id is not None and self.publish is not None

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
        publish = self.publish
        if self.comm_id is None or publish is None:
            raise BrokerUnavailable(NO_HOST)
        if threading.current_thread().name == CONTROL_THREAD:
            # The answer arrives on this very thread: waiting here would never end (the debugger
            # runs code while Control waits for it).
            raise BrokerUnavailable("a request from the kernel's Control thread cannot wait for the host's answer")
        self._wait_for_host()
        req_id = uuid.uuid4().hex
        event = threading.Event()
        box: list[BrokerAnswer] = []
        with self._lock:
            self._pending[req_id] = (event, box)
        try:
            # Sent as given: the host checks every payload (code in the kernel can send anything).
            publish(self.comm_id, BrokerRequest(req_id=req_id, kind=kind, payload=cast("dict[str, Any]", payload)))
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
        """(Control thread) an answer arrived."""
        with self._lock:
            waiting = self._pending.get(str(content.get("req_id")))
        if waiting is not None:
            event, box = waiting
            answer = content.get("answer")
            box.append(cast(BrokerAnswer, dict(answer)) if isinstance(answer, dict) else BrokerAnswer())
            event.set()


# One per kernel process: the network guard (installed before ipykernel) and the kernel share it.
BROKER = BrokerClient()
