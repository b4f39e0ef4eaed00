"""[host] Blocking work off the event loop, on threads that survive a fork of the host.

``asyncio.to_thread`` and ``run_in_executor(None, ...)`` use the loop's default executor. A host that
forks after using it (nbclient's parallel notebooks fork; so does ``multiprocessing`` by default on
Linux) hands the child an executor that believes its idle worker still exists: the child's work is
queued for a thread that is not there, and the child waits for ever (a kernel start that never
returns). Our executor is replaced in every forked child, so the child starts its own threads.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["off_loop"]

T = TypeVar("T")
WORKERS = 8  # concurrent blocking steps across the host's kernels (starts, kills, table reads)


def _fresh() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="ivralo-off-loop")


_executor = _fresh()


def _after_fork_in_child() -> None:
    global _executor  # the parent's workers do not exist here; the old object is left unused
    _executor = _fresh()


os.register_at_fork(after_in_child=_after_fork_in_child)


async def off_loop(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` on one of our threads, awaited from the running loop."""
    return await asyncio.get_running_loop().run_in_executor(_executor, functools.partial(fn, *args))
