"""The watchdog's IOPub subscription (``protocol/iopub_topics.py``): narrowed to the kernel's status
topic after its welcome, a socket gets each execution's busy and idle and none
of its input, result or output, nor a welcome for those topics, through the sandbox's relay, from a
real kernel. If ipykernel stops using
``Kernel.ident`` in its topics, or the kernel's ident stops following the key, the busy and idle
stop arriving here, and the host's deadlines would stop with them."""

from __future__ import annotations

import time

import zmq
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager
from jupyter_client.session import Session

from ivralo_kernel.protocol.iopub_topics import kernel_ident, watchdog_topics


def test_the_watchdogs_topics_carry_status_and_nothing_of_the_output(
    km: KernelManager, kc: BlockingKernelClient
) -> None:
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    try:
        sub.setsockopt(zmq.SUBSCRIBE, b"")  # as the watchdog does: everything until welcomed
        sub.connect(f"{km.transport}://{km.ip}:{km.iopub_port}")
        session = Session(key=km.session.key)
        deadline = time.monotonic() + 30
        welcomed = False
        while not welcomed:  # our subscription is live once its welcome arrives
            assert sub.poll(max(1, int((deadline - time.monotonic()) * 1000))), "no iopub_welcome in 30 s"
            _, parts = session.feed_identities(sub.recv_multipart())
            welcomed = session.deserialize(parts)["msg_type"] == "iopub_welcome"
        for topic in watchdog_topics(km.session.key):  # then narrowed, in this order (status alone)
            sub.setsockopt(zmq.SUBSCRIBE, topic)
        sub.setsockopt(zmq.UNSUBSCRIBE, b"")
        reply = kc.execute_interactive("print('x' * 100_000); 1 + 1", timeout=30, output_hook=lambda msg: None)
        assert reply["content"]["status"] == "ok"
        assert reply["metadata"]["engine"] == kernel_ident(km.session.key)  # the kernel's ident follows the key
        seen: list[tuple[str, str]] = []
        msg_id = reply["parent_header"]["msg_id"]
        while ("status", "idle") not in seen:
            assert sub.poll(max(1, int((deadline - time.monotonic()) * 1000))), f"no idle in 30 s: {seen}"
            frames = sub.recv_multipart()
            _, parts = session.feed_identities(frames)
            msg = session.deserialize(parts)
            assert msg["msg_type"] != "iopub_welcome", "the kernel welcomed a watchdog's topic"
            if msg["parent_header"].get("msg_id") == msg_id:
                seen.append((msg["msg_type"], msg["content"].get("execution_state", "")))
        assert seen == [("status", "busy"), ("status", "idle")], seen
    finally:
        sub.close(linger=0)
        context.term()
