"""Sampling a kernel's process tree from outside, with real processes: the scan of who is whose
child is shared by every watchdog of a host (one scan, not one per kernel), and must still find every
descendant."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import kill_tree

from ivralo_kernel.host.watch.observer import sample_tree

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
