"""[host] The host's end of the broker's socket: a stream ``socketpair`` made for each kernel launch,
whose other end the kernel gets (``ENV_BROKER_FD``, passed through bwrap and the supervisor).

The watchdog's thread reads the kernel's requests (``read``, when its poll says the socket is
readable; a bounded amount each turn); any thread writes an answer (``send``), which never waits:
what the socket does not take at once goes to a sender thread. What the kernel writes is input:
frames are capped (``MAX_REQUEST_BYTES``); a kernel that reads no answer for ``SEND_TIMEOUT_S``, or
leaves ``MAX_QUEUED_BYTES`` of them unread, gets no more.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import select
import socket
import threading
import time
from typing import Any

from jupyter_client.session import json_packer

from ivralo_kernel.protocol import broker_frames, names

SEND_TIMEOUT_S = 10.0  # a kernel that reads none of its answers for this long gets no more
MAX_QUEUED_BYTES = 64 << 20  # answers written but not read yet, at most
POLL_MS = 200
READ_CHUNK = 1 << 16
READS_PER_TURN = 16  # 1 MiB at most per watchdog turn
log = logging.getLogger(__name__)


class BrokerSocket:
    def __init__(self) -> None:
        # Both ends close-on-exec (Python's default); the launch passes the kernel's on (pass_fds).
        self._host, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._kernel: socket.socket | None = kernel
        self.kernel_fd = kernel.fileno()  # its number in a launch's pass_fds, kept after it closes
        # Non-blocking: a read takes what is there, and a send what the socket takes (not
        # with ``settimeout``: Python's timeout mode polls before each recv, so a read would wait).
        self._host.setblocking(False)
        self._frames = broker_frames.FrameReader(broker_frames.MAX_REQUEST_BYTES)
        self._read_lock = threading.Lock()  # a stopping watchdog and its successor never split a frame
        self._send_lock = threading.Lock()
        self._room = threading.Condition(self._send_lock)  # the sender thread waits for answers here
        self._queue: collections.deque[memoryview] = collections.deque()  # what did not go at once
        self._queued = 0
        self._sender: threading.Thread | None = None
        self.eof = False
        self._broken = False  # the kernel stopped reading, or exited: no more answers go

    def fileno(self) -> int:
        return self._host.fileno()

    def pass_to(self, env: dict[str, str], pass_fds: tuple[int, ...]) -> tuple[int, ...]:
        """Give the kernel's end to a launch (its environment names it); returns the new ``pass_fds``."""
        if self._kernel is None:
            raise RuntimeError("the broker socket's kernel end was passed on already; make a new BrokerSocket")
        env[names.ENV_BROKER_FD] = str(self._kernel.fileno())
        return (*pass_fds, self._kernel.fileno())

    def launched(self) -> None:
        """The kernel holds its end now: ours closes, so that its exit is our EOF."""
        if self._kernel is not None:
            self._kernel.close()
            self._kernel = None

    def read(self) -> list[Any]:
        """(the watchdog's thread) The frames that arrived; each a decoded request, or None for one
        that was not (too long, no JSON). Sets ``eof`` once the kernel's end is closed."""
        found: list[Any] = []
        with self._read_lock:
            # A bounded amount each time: a kernel that writes without pause must not keep the
            # watchdog's thread here, away from its deadlines (the poll says readable again at once).
            for _ in range(READS_PER_TURN):
                if self.eof:
                    break
                try:
                    chunk = self._host.recv(READ_CHUNK)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    chunk = b""
                if not chunk:
                    self.eof = True
                    break
                found += self._frames.feed(chunk)
        return found

    def send(self, answer: Any) -> None:
        """(any thread, never waits) One answer: written now if the socket takes it whole, else queued
        for the sender thread. The watchdog's thread answers some requests itself, and a kernel that
        stops reading must not hold it (nor a broker thread) away from its work."""
        frame = broker_frames.encode(answer, json_packer)
        with self._send_lock:
            if self._broken:
                return
            if not self._queue:
                try:
                    sent = self._host.send(frame)
                except (BlockingIOError, InterruptedError):
                    sent = 0
                except OSError as exc:  # it exited
                    self._break(exc.strerror or str(exc))
                    return
                if sent == len(frame):
                    return
                frame = frame[sent:]
            if self._queued + len(frame) > MAX_QUEUED_BYTES:
                self._break(f"it left more than {MAX_QUEUED_BYTES >> 20} MiB of answers unread")
                return
            self._queue.append(memoryview(frame))
            self._queued += len(frame)
            if self._sender is None:
                self._sender = threading.Thread(target=self._send_queued, name="ivralo-broker-send", daemon=True)
                self._sender.start()
            self._room.notify()

    def _send_queued(self) -> None:
        """(the sender thread) What did not go at once, in order, as the kernel reads."""
        poll = select.poll()  # not select(): a host with many kernels has descriptors above 1023
        poll.register(self._host, select.POLLOUT)
        stuck_since = time.monotonic()
        while True:
            with self._send_lock:
                while not self._queue and not self._broken:
                    self._room.wait()
                    stuck_since = time.monotonic()
                if self._broken:
                    return
                head = self._queue[0]
            try:
                ready = poll.poll(POLL_MS)
            except InterruptedError:
                continue
            with self._send_lock:
                if self._broken:
                    return
                try:
                    sent = self._host.send(head) if ready else 0
                except (BlockingIOError, InterruptedError):
                    sent = 0
                except OSError as exc:
                    self._break(exc.strerror or str(exc))
                    return
                if sent:
                    stuck_since = time.monotonic()
                    self._queued -= sent
                    if sent == len(head):
                        self._queue.popleft()
                    else:
                        self._queue[0] = head[sent:]
                elif time.monotonic() - stuck_since > SEND_TIMEOUT_S:
                    self._break(f"it read none of its answers for {SEND_TIMEOUT_S:g} s")
                    return

    def _break(self, why: str) -> None:
        """(holding the send lock) No more answers: part of a frame may have gone, and nothing after
        it could be read as one. Our side ends, and the kernel's waiting requests end with it ("the
        host closed its broker socket")."""
        self._broken = True
        self._queue.clear()
        self._queued = 0
        self._room.notify_all()
        with contextlib.suppress(OSError):
            self._host.shutdown(socket.SHUT_WR)
        log.warning("ivralo broker: the kernel's answers stop here: %s", why)

    def close(self) -> None:
        self.launched()
        with self._send_lock:
            self._broken = True  # the sender thread ends
            self._queue.clear()
            self._room.notify_all()
        with contextlib.suppress(OSError):
            self._host.close()
