"""Sampling a kernel's process tree from outside, with real processes: the scan of who is whose
child is shared by every watchdog of a host (one scan, not one per kernel), and must still find every
descendant. The deadline's settling reads the tree's CPU alone (``tree_cpu_s``), outside its lock."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time

from conftest import kill_tree

from ivralo_kernel.host.watch.deadline import DeadlineWatch
from ivralo_kernel.host.watch.escalation import DeadlinePolicy, Phase
from ivralo_kernel.host.watch.observer import sample_tree, tree_cpu_s

ANSWER_S = 0.5  # what a call that takes no lock gets to answer from another thread

# A parent that starts a child, says its pid, and waits.
PARENT = (
    "import subprocess, sys, time; "
    "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    "print(c.pid, flush=True); time.sleep(60)"
)


def test_a_sample_covers_the_whole_tree_and_a_fresh_scan_sees_a_new_child() -> None:
    sample_tree(os.getpid())  # the shared scan is taken before the tree below exists
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        sample = sample_tree(parent.pid, max_age_s=0)
        assert sample is not None and sample.processes == 2, sample
        assert sample.rss > 0 and sample.state != "gone"
        mine = sample_tree(os.getpid(), max_age_s=0)
        assert mine is not None and mine.processes >= 3  # pytest, the parent and its child
        assert child != parent.pid
        # The CPU alone, read from /proc/PID/stat, is what psutil sums (two Python start-ups, so not
        # nothing): between a sample before and one after (the child may still be starting).
        cpu_s = tree_cpu_s(parent.pid, max_age_s=0)
        after = sample_tree(parent.pid, max_age_s=0)
        assert cpu_s is not None and after is not None and cpu_s > 0
        assert sample.cpu_s - 0.01 <= cpu_s <= after.cpu_s + 0.01, (sample, cpu_s, after)
        assert (tree_cpu_s(child, max_age_s=0) or 0) < cpu_s, "the parent's own CPU counts too"
    finally:
        kill_tree(parent.pid)
        parent.wait(timeout=10)
        if parent.stdout is not None:
            parent.stdout.close()


def test_a_gone_root_gives_no_sample() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    assert sample_tree(int(done.stdout), max_age_s=0) is None
    assert tree_cpu_s(int(done.stdout), max_age_s=0) is None


def test_the_settling_reference_is_read_outside_the_deadline_lock() -> None:
    """Every result asks the deadline's watch whether its execution was interrupted, as the kernel's
    idle arrives: the tree's reading taken then must not keep that question waiting. Each time the
    watch reads its clock while it handles the idle, another thread asks; one of them must be
    answered (the reading's own time, taken with the tree's CPU)."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    answered: list[bool] = []
    probing = threading.Event()

    def clock() -> float:
        if probing.is_set():
            asked = threading.Thread(target=watch.interrupted, args=("m",), daemon=True)
            asked.start()
            asked.join(ANSWER_S)
            answered.append(not asked.is_alive())
        return time.monotonic()

    try:
        watch = DeadlineWatch(
            DeadlinePolicy(deadline_ms=60_000),
            sleeper.pid,
            clock,
            kill=lambda _msg_id, _cause: None,
            signal_interrupt=lambda: None,
            backstop=None,
            log=logging.getLogger(__name__),
        )
        watch.on_busy("m", real=True)
        probing.set()
        watch.on_idle("m")
        probing.clear()
        assert watch.phase_of("m") is Phase.SETTLING
        assert True in answered, f"interrupted() waited on the lock at every reading of the clock: {answered}"
    finally:
        sleeper.kill()
        sleeper.wait(timeout=10)
