"""[host] The watchdog's memory handler: the kernel tree's memory against the soft limit (one notice
per episode, for the next result) and the hard limit (the tree is killed). Its memory is its RSS and
what it holds outside RSS (tmpfs files, memfds, the exchange folder: host/watch/held_memory.py)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from ivralo_kernel.host.watch.observer import Sample, human_bytes


class MemoryWatch:
    def __init__(
        self, soft_bytes: int | None, hard_bytes: int | None, log: logging.Logger | logging.LoggerAdapter[Any]
    ) -> None:
        self.soft_bytes, self.hard_bytes, self._log = soft_bytes, hard_bytes, log
        self._episode = False  # above the soft limit since the last notice
        self._notice: str | None = None
        self._lock = threading.Lock()

    def check(self, sample: Sample) -> str | None:
        """(the watchdog's thread) The cause to kill the tree for, or None."""
        if self.hard_bytes is not None and sample.memory > self.hard_bytes:
            rss = human_bytes(sample.rss)
            return f"memory: RSS {rss}{_held(sample)} exceeded memory_hard_limit_bytes={self.hard_bytes}"
        soft = self.soft_bytes
        if soft is None:
            return None
        with self._lock:
            if sample.memory > soft and not self._episode:
                self._episode = True
                rss = human_bytes(sample.rss)
                self._notice = (
                    f"[ivralo memory] RSS {rss}{_held(sample)} exceeds the {human_bytes(soft)} soft limit — "
                    "delete objects you no longer need (del name)"
                )
                self._log.warning("ivralo: %s", self._notice)
            elif sample.memory <= soft:
                self._episode = False
        return None

    def take_notice(self) -> str | None:
        """(any thread) The soft-limit line, once per episode (the next result carries it)."""
        with self._lock:
            notice, self._notice = self._notice, None
            return notice


def _held(sample: Sample) -> str:
    if not sample.held:
        return ""
    return f" + {human_bytes(sample.held)} in files on tmpfs and shared memory (/tmp, /dev/shm, memfd)"
