"""[host] The watchdog's broker handler: the kernel's requests (``comm_msg`` on IOPub, on the broker
comm it got at launch) go to the ``BrokerResponder``; answers go back on control.

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

if TYPE_CHECKING:  # the broker (sqlalchemy, httpx) is loaded by the host that has one, not by a raw launch
    from ivralo_kernel.host.broker.responder import BrokerResponder

HELLO_RETRY_S = 0.5

Execution = Callable[[str | None], str | None]  # a request's parent msg_id -> the execution, if running
Pause = Callable[[str, bool], None]  # (execution, on): the deadline does not count while somebody answers


class BrokerLink:
    def __init__(self, responder: BrokerResponder, comm_id: str | None, clock: Callable[[], float]) -> None:
        self.responder = responder
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

    def on_request(self, msg: dict[str, Any], execution: Execution, channels: KernelChannels, pause: Pause) -> None:
        """(the watchdog's thread) One ``comm_msg``: ours if it is on the broker comm."""
        content = msg.get("content") or {}
        if content.get("comm_id") != self.comm_id:
            return
        request = content.get("data")
        req_id = request.get("req_id") if isinstance(request, dict) else None
        running = execution((msg.get("parent_header") or {}).get("msg_id"))

        def reply(answer: BrokerAnswer) -> None:  # from this thread, an asking or a calling thread
            channels.send_control(names.MSG_BROKER_REPLY, BrokerReply(req_id=str(req_id), answer=answer))

        def pause_deadline(on: bool) -> None:
            if running is not None:
                pause(running, on)

        self.responder.answer(request, running, reply, pause_deadline)
