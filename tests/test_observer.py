"""Observer verdicts from samples, with an injected clock and sampler (no process involved)."""

from __future__ import annotations

import pytest

from ivralo_kernel.host.watch.observer import Observer, Sample

pytestmark = pytest.mark.fast  # starts no process: the fast tier (make test-fast)


class FakeTree:
    def __init__(self) -> None:
        self.now = 0.0
        self.cpu = 0.0

    def clock(self) -> float:
        return self.now

    def sample(self, pid: int) -> Sample:
        return Sample(self.now, self.cpu, 100 << 20, 2, "running", "0", 11)


def observer(tree: FakeTree) -> Observer:
    return Observer(1, stall_window_ms=2_000, clock=tree.clock, sampler=tree.sample)


def test_verdicts_follow_readiness_requests_and_cpu() -> None:
    tree = FakeTree()
    obs = observer(tree)
    assert obs.verdict() == "unavailable"
    obs.poll()
    assert obs.verdict() == "booting"
    obs.ready = True
    assert obs.verdict() == "settled"
    obs.busy = True
    for _ in range(5):  # CPU advancing while a request is in flight
        tree.now += 0.5
        tree.cpu += 0.5
        obs.poll()
    assert obs.verdict() == "computing"
    for _ in range(5):  # flat for longer than the stall window
        tree.now += 0.5
        obs.poll()
    assert obs.verdict() == "stalled"
    assert obs.describe().startswith("observer: stalled; last sample cpu=2.50s rss=100.00 MiB state=running")


def test_cpu_advancing_without_a_known_request_is_computing() -> None:
    """The kernel's "busy" may never reach the host (native code starves its IOPub thread)."""
    tree = FakeTree()
    obs = observer(tree)
    obs.ready = True
    for _ in range(4):
        tree.now += 0.25
        tree.cpu += 0.25
        obs.poll()
    assert obs.verdict() == "computing"


def test_boot_diagnosis_tells_starved_from_stalled() -> None:
    tree = FakeTree()
    obs = observer(tree)
    for _ in range(8):
        tree.now += 0.5
        tree.cpu += 0.05
        obs.poll()
    assert obs.boot_diagnosis() == "cpu advanced 0.35 s in 3.5 s (starved)"
    for _ in range(4):
        tree.now += 0.5
        obs.poll()
    assert obs.boot_diagnosis().endswith("(stalled)")
