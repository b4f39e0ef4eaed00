"""The watchdog's memory handler alone (host/watch/memory.py): the soft limit's notice comes once per
episode, the hard limit names its cause. The whole path, with a real kernel, is in test_session.py."""

from __future__ import annotations

import logging

import pytest

from ivralo_kernel.host.watch.memory import MemoryWatch
from ivralo_kernel.host.watch.observer import Sample

pytestmark = pytest.mark.fast

MIB = 1 << 20


def at(rss_mib: int) -> Sample:
    return Sample(at=0.0, cpu_s=0.0, rss=rss_mib * MIB, processes=1, state="S", wchan="", threads=1)


def test_the_soft_limit_warns_once_per_episode() -> None:
    watch = MemoryWatch(soft_bytes=100 * MIB, hard_bytes=None, log=logging.getLogger("test"))
    assert watch.check(at(150)) is None
    notice = watch.take_notice()
    assert notice is not None and notice.startswith("[ivralo memory] RSS 150") and "soft limit" in notice
    assert watch.check(at(160)) is None and watch.take_notice() is None  # the same episode
    watch.check(at(50))  # below: the episode ends
    watch.check(at(120))
    assert watch.take_notice() is not None


def test_the_hard_limit_names_its_cause() -> None:
    watch = MemoryWatch(soft_bytes=None, hard_bytes=200 * MIB, log=logging.getLogger("test"))
    assert watch.check(at(199)) is None
    cause = watch.check(at(201))
    assert cause is not None and cause.endswith(f"exceeded memory_hard_limit_bytes={200 * MIB}")
