"""[kernel] Ask the host something from inside a running cell, and wait for its answer.

Requests go out as ``comm_msg`` on the comm the host opened (``ivralo.broker``); answers come back
as the ``ivralo_broker_reply`` control message, which the Control thread serves while a synchronous
cell blocks (a reply on shell would wait until the cell ends: a deadlock). The wait is an
``Event.wait``, which an interrupt ends at once.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any, Protocol


class PersonPrompt(Protocol):
    """The person at the frontend, reached through the running cell's stdin channel."""

    def available(self) -> bool:
        """True when the running execution allows input requests (a notebook or console does)."""
        ...

    def ask(self, prompt: str) -> str: ...


class BrokerUnavailable(RuntimeError):
    """No ivralo host is attached to answer."""


class BrokerClient:
    def __init__(self) -> None:
        self._comm: Any = None
        self.person: PersonPrompt | None = None  # set by the kernel once it is built
        # Called around a wait: the deadline backstop stops counting while the host (or a person) answers.
        self.on_wait: tuple[Callable[[], None], Callable[[], None]] | None = None
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[threading.Event, list[dict[str, Any]]]] = {}
        self.records: list[dict[str, Any]] = []  # the host's record of each call it made, this execution

    def take_records(self) -> list[dict[str, Any]]:
        records, self.records = self.records, []
        return records

    @property
    def attached(self) -> bool:
        return self._comm is not None

    def attach(self, comm: Any) -> None:
        self._comm = comm
        comm.on_close(lambda _msg: self._detach())

    def _detach(self) -> None:
        self._comm = None

    def ask(
        self, kind: str, payload: dict[str, Any], timeout: float, *, pause_deadline: bool = False
    ) -> dict[str, Any]:
        """Send a request and wait for its answer. ``pause_deadline``: somebody may be asked, whose
        time does not count against the cell's deadline."""
        comm = self._comm
        if comm is None:
            raise BrokerUnavailable(
                "no ivralo host is attached to this kernel to answer (it was started without one: VS Code and "
                "other raw launches run kernel.json's command directly). Run it under an ivralo host: JupyterLab, "
                "jupyter console or any jupyter_client host with the ivralo kernelspec, or ivralo_kernel.host.Session"
            )
        req_id = uuid.uuid4().hex
        event = threading.Event()
        box: list[dict[str, Any]] = []
        with self._lock:
            self._pending[req_id] = (event, box)
        try:
            comm.send({"req_id": req_id, "kind": kind, "payload": payload})
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

    def deliver(self, content: dict[str, Any]) -> None:
        """(Control thread) an answer arrived."""
        with self._lock:
            waiting = self._pending.get(str(content.get("req_id")))
        if waiting is not None:
            event, box = waiting
            box.append(dict(content.get("answer") or {}))
            event.set()


# One per kernel process: the network guard (installed before ipykernel) and the kernel share it.
BROKER = BrokerClient()
