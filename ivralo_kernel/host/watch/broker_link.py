"""[host] The watchdog's broker handler: the kernel's requests (frames on the broker's socket,
host/watch/broker_socket.py) go to the ``BrokerResponder``, bound to the execution they name if the
watchdog saw it start on IOPub; answers go back on the same socket.

The kernel sends no request before our hello: we send it once our IOPub subscription is live (any
message on it proves it: ipykernel sends an ``iopub_welcome`` first), and again every
``HELLO_RETRY_S`` until the kernel answers, on the connection its answers will come back on.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ivralo_kernel.host.watch.kernel_channels import KernelChannels
from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.messages import BrokerAnswer, BrokerHello, BrokerReply

if TYPE_CHECKING:  # the broker (sqlalchemy) is loaded by the host that has one, not by a raw launch
    from ivralo_kernel.host.broker.responder import BrokerResponder
    from ivralo_kernel.host.watch.broker_socket import BrokerSocket

HELLO_RETRY_S = 0.5
# How long a request may wait for its execution's "busy" (published before the cell ran, on IOPub,
# through ipykernel's IOPub thread) and how many may wait: a few at most, in any real kernel.
HOLD_S = 1.0
MAX_HELD = 64

Execution = Callable[[str | None], str | None]  # a request's parent msg_id -> the execution, if running
Pause = Callable[[str, bool], None]  # (execution, on): the deadline does not count while somebody answers


class BrokerLink:
    def __init__(
        self, responder: BrokerResponder, comm_id: str | None, link: BrokerSocket, clock: Callable[[], float]
    ) -> None:
        self.responder = responder
        self.socket = link
        self._held: list[tuple[float, dict[str, Any]]] = []  # (until, request): its execution not seen yet
        self.comm_id = comm_id or uuid.uuid4().hex  # the kernel got it at launch (IVRALO_BROKER_COMM)
        self.ready = threading.Event()  # the kernel answered our hello: requests flow both ways
        self._clock = clock
        self._next_hello = 0.0

    def say_hello(self, channels: KernelChannels, subscribed: bool) -> None:
        """(the watchdog's thread) Until the kernel has answered, once our subscription is live."""
        if self.ready.is_set() or not subscribed:
            return
        now = self._clock()
        if now >= self._next_hello:
            channels.send(names.MSG_BROKER_HELLO, BrokerHello(comm_id=self.comm_id), self._on_hello_reply)
            self._next_hello = now + HELLO_RETRY_S

    def _on_hello_reply(self, reply: dict[str, Any]) -> None:
        if (reply.get("content") or {}).get("status") == "ok":
            self.ready.set()

    def on_frames(self, frames: list[Any], execution: Execution, pause: Pause) -> None:
        """(the watchdog's thread) Requests read from the broker's socket. One whose execution has not
        been seen to start yet (its "busy" may still be on its way on IOPub: the two do not travel
        together) waits for it, up to ``HOLD_S``; past that, it is answered as not from a running one."""
        for frame in frames:
            parent = frame.get("parent") if isinstance(frame, dict) else None
            if isinstance(parent, str) and execution(parent) is None and len(self._held) < MAX_HELD:
                self._held.append((self._clock() + HOLD_S, frame))
            else:
                self._answer(frame, execution, pause)

    def on_busy(self, execution: Execution, pause: Pause) -> None:
        """(the watchdog's thread) An execution started: the requests that waited for it go on."""
        held, self._held = self._held, []
        for until, frame in held:
            if execution(frame["parent"]) is not None:
                self._answer(frame, execution, pause)
            else:
                self._held.append((until, frame))

    def expire(self, now: float, execution: Execution, pause: Pause) -> None:
        """(the watchdog's thread) Held requests whose execution never came: refused now."""
        if not self._held or self._held[0][0] > now:
            return
        expired = [frame for until, frame in self._held if until <= now]
        self._held = [(until, frame) for until, frame in self._held if until > now]
        for frame in expired:
            self._answer(frame, execution, pause)

    def wakeup(self) -> float | None:
        """When the oldest held request expires (for the watchdog's poll timeout)."""
        return self._held[0][0] if self._held else None

    def _answer(self, request: Any, execution: Execution, pause: Pause) -> None:
        parent = request.get("parent") if isinstance(request, dict) else None
        req_id = request.get("req_id") if isinstance(request, dict) else None
        running = execution(parent if isinstance(parent, str) else None)
        sock = self.socket

        def reply(answer: BrokerAnswer) -> None:  # from this thread, an asking or a calling thread
            sock.send(BrokerReply(req_id=str(req_id), answer=answer))

        def pause_deadline(on: bool) -> None:
            if running is not None:
                pause(running, on)

        self.responder.answer(request, running, reply, pause_deadline)
