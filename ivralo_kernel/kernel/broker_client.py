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
from typing import Any


class BrokerUnavailable(RuntimeError):
    """No ivralo host is attached to answer."""


class BrokerClient:
    def __init__(self) -> None:
        self._comm: Any = None
        # Called around a wait: the deadline backstop stops counting while the host (or a person) answers.
        self.on_wait: tuple[Callable[[], None], Callable[[], None]] | None = None
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[threading.Event, list[dict[str, Any]]]] = {}

    @property
    def attached(self) -> bool:
        return self._comm is not None

    def attach(self, comm: Any) -> None:
        self._comm = comm
        comm.on_close(lambda _msg: self._detach())

    def _detach(self) -> None:
        self._comm = None

    def ask(self, kind: str, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        comm = self._comm
        if comm is None:
            raise BrokerUnavailable(
                "no ivralo host is attached to answer (the kernel was started without one, e.g. by VS Code); "
                "start it through jupyter_client, JupyterLab or ivralo_kernel.host.Session"
            )
        req_id = uuid.uuid4().hex
        event = threading.Event()
        box: list[dict[str, Any]] = []
        with self._lock:
            self._pending[req_id] = (event, box)
        try:
            comm.send({"req_id": req_id, "kind": kind, "payload": payload})
            if self.on_wait is not None:
                self.on_wait[0]()
            try:
                if not event.wait(timeout):
                    raise TimeoutError(f"the ivralo host did not answer a {kind} request within {timeout:g} s")
            finally:
                if self.on_wait is not None:
                    self.on_wait[1]()
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
