"""[protocol] Frames on the broker's socket: the kernel's requests and the host's answers, both ways
on one stream ``socketpair`` the host makes at launch (``ENV_BROKER_FD``).

Why a socket of its own and not Jupyter's channels: a request on IOPub went through ipykernel's IOPub
thread, libzmq and the watchdog's subscription, and its answer through control, the Control thread and
a ``Session.deserialize`` (about 1.6 ms of a 2.7 ms brokered call, bench/hot_path_breakdown.py
--broker). One write and one read each way cost a few tens of microseconds.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON. The kernel is the
adversary: the reader keeps at most ``limit`` bytes of one frame, skips a longer one whole (its length
says where it ends), and yields ``None`` for bytes that are no JSON, never a guess.
"""

from __future__ import annotations

import binascii
import datetime
import json
import numbers
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

HEADER = struct.Struct(">I")
MAX_FRAME = HEADER.size + 0xFFFF_FFFF  # what the header can say
# A request is a call's parameters or a query's text (MAX_SQL_CHARS, 100,000) and its parameters.
MAX_REQUEST_BYTES = 4 << 20
# An answer is an operation's response (its cap, 1 MiB by default) or a query's rows below the Arrow
# threshold, as JSON; bigger results travel through the data plane's shared memory.
MAX_ANSWER_BYTES = 256 << 20

Packer = Callable[[Any], bytes]


def _jsonable(obj: Any) -> Any:
    """What jupyter_client's ``json_default`` makes of what JSON has no type for, so that a request
    carries what it carried as a Jupyter message: a date as ISO text, bytes as base64, a numpy
    number as a number, any other iterable as a list."""
    if isinstance(obj, datetime.datetime):
        if obj.tzinfo is None:  # local time, as jupyter_client takes it
            obj = obj.astimezone()
        return obj.isoformat().replace("+00:00", "Z")
    if isinstance(obj, bytes):
        return binascii.b2a_base64(obj, newline=False).decode("ascii")
    if isinstance(obj, numbers.Integral):
        return int(obj)
    if isinstance(obj, numbers.Real):
        return float(obj)
    if isinstance(obj, Iterable):
        return list(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def pack(obj: Any) -> bytes:
    return json.dumps(obj, default=_jsonable, ensure_ascii=False, allow_nan=False).encode("utf8", "surrogateescape")


def encode(obj: Any, pack: Packer = pack) -> bytes:
    """One frame. ``pack``: the host gives jupyter_client's ``json_packer``, as its answers went before."""
    body = pack(obj)
    if len(body) > 0xFFFF_FFFF:
        raise ValueError(f"a broker frame of {len(body)} bytes is over the 4 GiB a frame can hold")
    return HEADER.pack(len(body)) + body


@dataclass
class FrameReader:
    """The frames of one stream, fed chunk by chunk as they are read: each complete one, decoded."""

    limit: int
    _buffer: bytearray = field(default_factory=bytearray)
    _skip: int = 0  # bytes of an over-long frame still to drop

    def feed(self, chunk: bytes) -> list[Any]:
        found: list[Any] = []
        view = memoryview(chunk)
        if self._skip:
            dropped = min(self._skip, len(view))
            self._skip -= dropped
            view = view[dropped:]
        self._buffer += view
        while len(self._buffer) >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buffer)
            if size > self.limit:
                held = len(self._buffer) - HEADER.size
                self._skip = max(0, size - held)
                del self._buffer[: HEADER.size + min(size, held)]
                found.append(None)
                continue
            end = HEADER.size + size
            if len(self._buffer) < end:
                break
            body = bytes(self._buffer[HEADER.size : end])
            del self._buffer[:end]
            try:
                found.append(json.loads(body))
            except (ValueError, RecursionError):
                found.append(None)
        return found
