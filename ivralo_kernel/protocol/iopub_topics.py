"""[protocol] The IOPub topics the host's watchdog subscribes to, instead of everything.

ipykernel publishes each message under a topic (the first frame): ``kernel.<ident>.status``,
``kernel.<ident>.execute_input``, ``stream.stdout``, ``comm-<comm_id>``... and its XPUB sends a
subscriber only what matches the subscriber's prefixes, in libzmq, before Python sees it. The
watchdog acts on executions' ``status`` alone (the broker's requests come on a socket of their own,
protocol/broker_frames.py); subscribed to everything, it received and parsed every cell's input,
result and output too (two of a ``1+1`` cell's four messages, and each megabyte a cell prints).

``<ident>`` is ipykernel's ``Kernel.ident``, a random uuid unless the kernel sets it: the ivralo
kernel derives it from the connection's key, which the host holds too, so the watchdog knows the
status topic without being told (a spare, a restart and a raw launch need no plumbing). The key is
the one both sides sign with, so a watchdog that can talk to the kernel at all has the same one.
The watchdog subscribes to everything first, as a client does, for its ``iopub_welcome`` (the
proof that it is heard, looking like each client's own), then to these and off everything; the
kernel sends no welcome for them, which every client subscribed to everything would get too.

A kernel that publishes a status under another topic hides it from the watchdog, as it could by not
publishing it: the deadline starts from the relay's count of requests too.
"""

from __future__ import annotations

import hashlib
import uuid


def kernel_ident(key: bytes) -> str:
    """A uuid (ipykernel's default is one; clients see it as the reply metadata's ``engine``), from a
    hash of the key: it says nothing of the key."""
    return str(uuid.UUID(bytes=hashlib.sha256(b"ivralo iopub ident\0" + key).digest()[:16]))


def comm_topic(comm_id: str) -> bytes:
    """The topic ipykernel's comms publish under (``comm-<comm_id>``): the data plane's pieces too."""
    return f"comm-{comm_id}".encode()


def watchdog_topics(key: bytes) -> tuple[bytes, ...]:
    """The prefixes the watchdog subscribes to: the kernel's status topic."""
    return (f"kernel.{kernel_ident(key)}.status".encode(),)
