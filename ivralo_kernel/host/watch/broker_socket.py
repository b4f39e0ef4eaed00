"""[host] The host's end of the broker's socket: a stream ``socketpair`` made for each kernel launch,
whose other end the kernel gets (``ENV_BROKER_FD``, passed through bwrap and the supervisor).

The watchdog's thread reads the kernel's requests (``read``, when its poll says the socket is
readable); any thread writes an answer (``send``). What the kernel writes is input: frames are capped
(``MAX_REQUEST_BYTES``), and a kernel that stops reading cannot block an answering thread for longer
than ``SEND_TIMEOUT_S``.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import threading
import time
from typing import Any

from jupyter_client.session import json_packer

from ivralo_kernel.protocol import broker_frames, names

SEND_TIMEOUT_S = 10.0
READ_CHUNK = 1 << 16
log = logging.getLogger(__name__)


class BrokerSocket:
    def __init__(self) -> None:
        # Both ends close-on-exec (Python's default); the launch passes the kernel's on (pass_fds).
        self._host, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._kernel: socket.socket | None = kernel
        self.kernel_fd = kernel.fileno()  # its number in a launch's pass_fds, kept after it closes
        # Non-blocking: a read takes what is there, a send waits for room in ``_send_all`` alone (not
        # with ``settimeout``: Python's timeout mode polls before each recv, so a read would wait).
        self._host.setblocking(False)
        self._frames = broker_frames.FrameReader(broker_frames.MAX_REQUEST_BYTES)
        self._read_lock = threading.Lock()  # a stopping watchdog and its successor never split a frame
        self._send_lock = threading.Lock()
        self.eof = False
        self._broken = False  # an answer went out in part: no more go

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
            while not self.eof:
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
        """(any thread) One answer; dropped with a log line if the kernel does not take it in time."""
        frame = broker_frames.encode(answer, json_packer)
        with self._send_lock:
            if self._broken:
                return
            try:
                self._send_all(frame)
            except OSError as exc:  # it exited, or stopped reading for SEND_TIMEOUT_S
                # A part of the frame may have gone: nothing after it could be read as a frame. Our
                # side ends, and the kernel's waiting requests end with it ("the host closed").
                self._broken = True
                with contextlib.suppress(OSError):
                    self._host.shutdown(socket.SHUT_WR)
                log.warning("ivralo broker: an answer could not be given to the kernel (%s)", exc.strerror or exc)

    def _send_all(self, frame: bytes) -> None:
        deadline = time.monotonic() + SEND_TIMEOUT_S
        view = memoryview(frame)
        while view:
            try:
                view = view[self._host.send(view) :]
                continue
            except (BlockingIOError, InterruptedError):
                pass
            left = deadline - time.monotonic()
            room = select.poll()  # not select(): a host with many kernels has descriptors above 1023
            room.register(self._host, select.POLLOUT)
            if left <= 0 or not room.poll(left * 1000):
                raise TimeoutError(f"the kernel took no answer for {SEND_TIMEOUT_S:g} s")

    def close(self) -> None:
        self.launched()
        with contextlib.suppress(OSError):
            self._host.close()
