"""[host] The watchdog's own line to a kernel: an IOPub subscription and a control connection.

It has its own jupyter_client ``Session`` identity, so it sees executions started by any client (a
browser tab, an agent) and never steals another client's replies. Its sockets belong to the
watchdog's thread; other threads hand it messages through ``send_control``, which wakes that thread's
poll at once (a brokered call's answer must not wait for the next poll timeout).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import zmq
from jupyter_client.session import Session as JupyterSession

from ivralo_kernel.protocol.processes import channel_url

RECONNECT_IVL_MS = 10  # how often our sockets retry a kernel that is not bound yet
DRAIN_AT_ONCE = 256  # messages of one socket handled per turn of the watchdog
OnReply = Callable[[dict[str, Any]], None]


def message_of(
    session: JupyterSession, frames: list[bytes], types: frozenset[str] | None = None
) -> dict[str, Any] | None:
    """The message the frames hold, or None: unsigned, too short, not of ``types``, or not the shape
    of a Jupyter message. Code in the kernel can publish anything on IOPub, signed too (it holds the
    key): a header that is a list, a date that is a number, a msg_id that is a dict, content nested
    past the parser. None of it may stop the watchdog (its deadlines would stop with it), nor reach
    its handlers, which read a message's parts as objects of strings.

    Not ``Session.deserialize``: its dates are parsed by dateutil (about half the watchdog's time per
    message, two messages a cell, for fields nothing here reads), and its replay check guards
    against nobody here (only the kernel, which holds the key, publishes). The signature is checked
    as it checks it, and the four parts are parsed as JSON, their dates left as the text they came in.
    """
    try:
        _, found = session.feed_identities(frames, copy=True)
        parts = cast("list[bytes]", found)  # copy=True: the frames as they came, bytes
        if len(parts) < 5:
            return None
        signature, header_raw, parent_raw, metadata_raw, content_raw = parts[:5]
        header = json.loads(header_raw)
        if types is not None and header.get("msg_type") not in types:
            return None
        if session.auth is not None and not hmac.compare_digest(
            signature, session.sign([header_raw, parent_raw, metadata_raw, content_raw])
        ):
            return None
        msg = {
            "header": header,
            "msg_id": header.get("msg_id"),
            "msg_type": header.get("msg_type"),
            "parent_header": json.loads(parent_raw),
            "metadata": json.loads(metadata_raw),
            "content": json.loads(content_raw),
            "buffers": parts[5:],
        }
    except (ValueError, KeyError, IndexError, AttributeError, TypeError, RecursionError):
        return None
    return msg if _well_formed(msg) else None


def _well_formed(msg: dict[str, Any]) -> bool:
    header, parent = msg.get("header"), msg.get("parent_header")
    if not isinstance(header, dict) or not isinstance(parent, dict):
        return False
    if not isinstance(msg.get("content"), dict) or not isinstance(msg.get("metadata"), dict):
        return False
    if not isinstance(header.get("msg_id"), str) or not isinstance(header.get("msg_type"), str):
        return False
    return all(isinstance(parent.get(key), str) for key in ("msg_id", "msg_type") if key in parent)


class KernelChannels:
    def __init__(
        self,
        connection_info: dict[str, Any],
        iopub_types: frozenset[str] | None = None,
        iopub_topics: tuple[bytes, ...] = (b"",),
    ) -> None:
        """``iopub_types``: the IOPub messages the handler is given (None: all). Others are dropped
        after their header alone is read (the kernel holds the key anyway: a signature proves nothing
        of it). ``iopub_topics``: the prefixes subscribed to (everything, by default); libzmq drops the
        rest before they reach this process (protocol/iopub_topics.py)."""
        key = connection_info["key"]
        self._info = connection_info
        self.iopub_types = iopub_types
        self.iopub_topics = iopub_topics
        self.iopub_seen = False  # any IOPub message arrived: our subscription is in place
        self.session = JupyterSession(
            key=key.encode() if isinstance(key, str) else key,
            signature_scheme=connection_info.get("signature_scheme", "hmac-sha256"),
            username="ivralo-watchdog",
        )
        # (msg_type, content, called with the kernel's reply or None): sent from the watchdog's thread
        self._outbox: queue.SimpleQueue[tuple[str, Mapping[str, Any], OnReply | None]] = queue.SimpleQueue()
        self._reply_waiters: dict[str, OnReply] = {}  # control msg_id -> callback
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._wake_lock = threading.Lock()
        self._context: zmq.Context[Any] | None = None
        self.iopub: zmq.Socket[Any] | None = None
        self.control: zmq.Socket[Any] | None = None
        self._poller = zmq.Poller()
        self._readers: dict[int, Callable[[], None]] = {}  # fd -> called when it is readable

    # -- the watchdog's thread --------------------------------------------------------------
    def open(self) -> None:
        context = self._context = zmq.Context()
        # We connect before the kernel binds, and the kernel serves nobody before our hello: retry
        # every 10 ms, not libzmq's 100, so that a new kernel's first request is not held for it.
        context.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
        self.iopub = context.socket(zmq.SUB)
        # Everything first, as a client does: its iopub_welcome is the proof that we are heard, and
        # looks like each client's own. Narrowed to ``iopub_topics`` once it came (``_narrow``).
        self.iopub.setsockopt(zmq.SUBSCRIBE, b"")
        self.iopub.connect(channel_url(self._info, "iopub"))
        self.control = context.socket(zmq.DEALER)
        self.control.setsockopt(zmq.IDENTITY, self.session.bsession)
        self.control.connect(channel_url(self._info, "control"))
        for socket in (self.iopub, self.control, self._wake_r):
            self._poller.register(socket, zmq.POLLIN)

    def close(self) -> None:
        for socket in (self.iopub, self.control):
            if socket is not None:
                socket.close(linger=0)
        if self._context is not None:
            self._context.term()
        with self._wake_lock:  # a late answer must not write to a reused descriptor number
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_w = -1

    def on_readable(self, fd: int, handler: Callable[[], None]) -> None:
        """``wait`` calls ``handler`` when ``fd`` is readable (the tree's pidfd, the broker's socket),
        after IOPub's messages: an execution's start is seen before what it sent elsewhere meanwhile."""
        self._poller.register(fd, zmq.POLLIN)
        self._readers[fd] = handler

    def forget(self, fd: int) -> None:
        self._poller.unregister(fd)
        self._readers.pop(fd, None)

    def wait(self, timeout_s: float, on_iopub: OnReply, on_control: OnReply) -> None:
        """Poll up to ``timeout_s``; hand each message to its handler (a control reply somebody waits
        for goes to that waiter instead); then send what other threads queued."""
        assert self.iopub is not None and self.control is not None
        events = dict(self._poller.poll(max(0, int(timeout_s * 1000))))
        if self.iopub in events:
            self._drain(self.iopub, on_iopub, self.iopub_types)
        if self.control in events:
            self._drain(self.control, lambda msg: self._dispatch_control(msg, on_control))
        for fd, handler in list(self._readers.items()):
            if fd in events:
                handler()
        if self._wake_r in events:
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 4096)
        while not self._outbox.empty():
            msg_type, content, on_reply = self._outbox.get()
            self.send(msg_type, content, on_reply)

    def send(self, msg_type: str, content: Mapping[str, Any], on_reply: OnReply | None = None) -> str:
        """(the watchdog's thread) One control message; its msg_id ("" if it could not be sent)."""
        assert self.control is not None
        sent = self.session.send(self.control, msg_type, dict(content))
        msg_id = str(sent["header"]["msg_id"]) if sent else ""
        if on_reply is not None and msg_id:
            self._reply_waiters[msg_id] = on_reply
        return msg_id

    def reply_to(self, msg_id: str, until: float, on_control: OnReply) -> dict[str, Any] | None:
        """(the watchdog's thread) Wait until CLOCK_MONOTONIC ``until`` for the reply to ``msg_id``;
        other control messages meanwhile go where they always go."""
        assert self.control is not None
        while (left := until - time.monotonic()) > 0 and self.control.poll(max(1, int(left * 1000))):
            try:
                frames = self.control.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                continue
            reply = message_of(self.session, frames)
            if reply is None:  # what the kernel sent is no message: not the reply
                continue
            if (reply.get("parent_header") or {}).get("msg_id") == msg_id:
                return dict(reply)
            self._dispatch_control(reply, on_control)
        return None

    def _dispatch_control(self, msg: dict[str, Any], on_control: OnReply) -> None:
        if not self._to_waiter(msg):
            on_control(msg)

    def _to_waiter(self, msg: dict[str, Any]) -> bool:
        parent_id = (msg.get("parent_header") or {}).get("msg_id")
        waiter = self._reply_waiters.pop(parent_id, None) if parent_id else None
        if waiter is None:
            return False
        waiter(msg)
        return True

    def _drain(self, socket: zmq.Socket[Any], handle: OnReply, types: frozenset[str] | None = None) -> None:
        # Bytes, not zmq.Frame objects (message_of reads bytes): under the watchdog's topics and on
        # control, messages are small. EVENTS says when the queue is empty, cheaper than the
        # exception of one more recv. At most DRAIN_AT_ONCE a turn: a kernel that publishes without
        # pause must not keep the watchdog's thread here, away from its deadlines (the next poll
        # returns at once while more wait).
        for _ in range(DRAIN_AT_ONCE):
            if not cast(int, socket.get(zmq.EVENTS)) & zmq.POLLIN:
                return
            try:
                frames = socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if socket is self.iopub and not self.iopub_seen:
                self.iopub_seen = True
                self._narrow()
            msg = message_of(self.session, frames, types)
            if msg is not None:
                handle(msg)

    def _narrow(self) -> None:
        """From everything to ``iopub_topics``: the new prefixes first, then everything dropped, on
        the same connection and in that order, so that no message under them falls in between. The
        kernel welcomes none of them (kernel/app.py): a client subscribed to everything would get
        those welcomes too."""
        assert self.iopub is not None
        if self.iopub_topics == (b"",):
            return
        for topic in self.iopub_topics:
            self.iopub.setsockopt(zmq.SUBSCRIBE, topic)
        self.iopub.setsockopt(zmq.UNSUBSCRIBE, b"")

    # -- any thread -------------------------------------------------------------------------
    def send_control(self, msg_type: str, content: Mapping[str, Any], on_reply: OnReply | None = None) -> None:
        """(any thread) Queue a control message for the watchdog's thread and wake it."""
        self._outbox.put((msg_type, content, on_reply))
        with self._wake_lock, contextlib.suppress(OSError):  # full: it is being drained anyway
            if self._wake_w >= 0:
                os.write(self._wake_w, b"!")
