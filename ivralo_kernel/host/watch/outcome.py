"""[host] ``Outcome``: how one execution ended, decided exactly once.

An execution ends one way: its reply reached the client that sent it (``Replied``), or the kernel's
tree was lost while it ran (``Lost``: the deadline's kill, a memory limit, a crash, the user's Esc,
a gateway's restart). The reply comes from that client's reader (only it reads its shell channel);
the loss from whoever watches the tree (the provisioner's watchdog, or ``GatewayWorker``). Both
race, so whichever comes first decides, under a lock, and the other is dropped: a caller awaits
one future and never polls.

A reply to an execution the deadline interrupted is held until the watchdog says the tree is
quiet (``settle``): a thread the cell left spinning keeps the execution running, and the watchdog
may still kill it, which then decides instead.

The future is a ``concurrent.futures.Future``: the watchdog resolves it from its own thread, and the
asyncio ``Session`` awaits it on its loop (``wait``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Replied:
    """The kernel answered: its ``execute_reply`` (None: it said idle, and no reply came in time)."""

    reply: dict[str, Any] | None


@dataclass(frozen=True)
class Lost:
    """The kernel's tree ended before the execution did (``why``: for logs; callers describe it)."""

    why: str


Ended = Replied | Lost


class Outcome:
    """One execution's end. ``held``: does a reply wait for the watchdog's word (see module doc)?"""

    def __init__(self, msg_id: str, held: Callable[[], bool] = lambda: False) -> None:
        self.msg_id = msg_id
        self.future: Future[Ended] = Future()
        self._held = held
        self._lock = threading.Lock()
        self._reply: Replied | None = None  # a reply waiting for the tree to settle

    @property
    def done(self) -> bool:
        return self.future.done()

    def reply(self, reply: dict[str, Any] | None) -> bool:
        """(the client's reader) The execution's reply came. True if that decided the outcome."""
        with self._lock:
            if self.future.done() or self._reply is not None:
                return False
            if self._held():
                self._reply = Replied(reply)
                return False
            return self._resolve(Replied(reply))

    def settle(self) -> bool:
        """(the watchdog) The tree has gone quiet: a held reply decides now."""
        with self._lock:
            return self._reply is not None and self._resolve(self._reply)

    def lose(self, why: str) -> bool:
        """(the watchdog, any thread) The tree is gone: unless a reply already decided, this does."""
        with self._lock:
            return self._resolve(Lost(why))

    def abandon(self) -> None:
        """Nobody waits for it any more (a namespace call that timed out): watchers may forget it."""
        with self._lock:
            self.future.cancel()

    def read_by(self, reader: asyncio.Task[None]) -> asyncio.Task[None]:
        """``reader`` gives the reply; if it fails instead (a closed channel), that is a loss, never a hang."""

        def ended(task: asyncio.Task[None]) -> None:
            if not task.cancelled() and (error := task.exception()) is not None:
                self.lose(f"reading the kernel's answer failed: {error!r}")

        reader.add_done_callback(ended)
        return reader

    def _resolve(self, ended: Ended) -> bool:
        if self.future.done():
            return False
        self.future.set_result(ended)
        return True

    async def wait(self, timeout_s: float | None = None) -> Ended:
        """(on the caller's loop) The outcome; ``TimeoutError`` after ``timeout_s`` (the outcome stays open)."""
        waiting = asyncio.shield(asyncio.wrap_future(self.future))
        return await (asyncio.wait_for(waiting, timeout_s) if timeout_s is not None else waiting)


class Outcomes:
    """The open outcomes of one kernel, by ``msg_id`` (thread-safe): what a loss resolves."""

    def __init__(self, held: Callable[[str], bool] = lambda _msg_id: False) -> None:
        self._held = held
        self._open: dict[str, Outcome] = {}
        self._lock = threading.Lock()
        self._lost: str | None = None  # the tree is gone: every later outcome is lost at once

    def of(self, msg_id: str) -> Outcome:
        """The outcome of ``msg_id`` (made on first use)."""
        with self._lock:
            outcome = self._open.get(msg_id)
            if outcome is None:
                outcome = self._open[msg_id] = Outcome(msg_id, lambda: self._held(msg_id))
                outcome.future.add_done_callback(lambda _f: self._forget(msg_id, outcome))
            lost = self._lost
        if lost is not None:
            outcome.lose(lost)
        return outcome

    def settle(self) -> None:
        """Held replies whose execution has settled decide now."""
        for outcome in self._snapshot():
            if not self._held(outcome.msg_id):
                outcome.settle()

    def lose_all(self, why: str) -> None:
        """The tree is gone: every open execution, and every one asked about later, is lost."""
        with self._lock:
            self._lost = self._lost or why
        for outcome in self._snapshot():
            outcome.lose(why)

    def renew(self) -> None:
        """A new kernel answers (a gateway's restart): outcomes from now on are open again."""
        with self._lock:
            self._lost = None

    def _snapshot(self) -> list[Outcome]:
        with self._lock:
            return list(self._open.values())

    def _forget(self, msg_id: str, outcome: Outcome) -> None:
        with self._lock:
            if self._open.get(msg_id) is outcome:
                del self._open[msg_id]
