"""[host] What the blocking twins of the async API (``SyncSession``, ``SyncAttachedSession``) share:
one event loop on a thread of its own, on which each call runs its coroutine and waits for it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """An event loop running on its own daemon thread until ``stop()``."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    @property
    def stopped(self) -> bool:
        return self._loop.is_closed()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Runs ``coro`` on the loop and blocks until it returns (or raises)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def stop(self) -> None:
        """Ends the loop and its thread; after this, ``call`` may not be used."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
