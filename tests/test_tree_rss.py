"""The kernel's tree RSS reader (``kernel/tree_rss.py``), which keeps its /proc files open between
readings: it still counts a child started after the first reading, and recovers when code in the
kernel closes its files under it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import psutil
import pytest

from ivralo_kernel.kernel.tree_rss import PAGE, TreeRss

CHILD_BYTES = 64 << 20
HOLD = f"b = bytearray({CHILD_BYTES}); b[::4096] = b'x' * len(b[::4096]); print('ready', flush=True); input()"


def _statm_rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm", "rb") as statm:
        return int(statm.read().split()[1]) * PAGE


def _tree_rss_now() -> int:
    """This process and its descendants, read by psutil: in the whole suite, pytest has children
    (session servers), which the tree reading rightly counts."""
    me = psutil.Process()
    total = 0
    for proc in [me, *me.children(recursive=True)]:
        try:
            total += proc.memory_info().rss
        except psutil.Error:  # ended between the listing and the reading
            pass
    return total


@pytest.mark.fast
def test_own_rss_and_closed_files() -> None:
    reader = TreeRss()
    try:
        first = reader.read()
        assert abs(first - _tree_rss_now()) < 8 << 20
        for fd in [reader._statm, *reader._children.values()]:  # what code in the kernel may do
            os.close(fd)
        assert abs(reader.read() - _tree_rss_now()) < 8 << 20
    finally:
        reader.close()


def test_a_child_started_after_the_first_reading_is_counted() -> None:
    reader = TreeRss()
    reader.read()  # the threads' files are open now; the child comes later
    child = subprocess.Popen([sys.executable, "-c", HOLD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        with_child = reader.read()
        own = _statm_rss(os.getpid())
        assert with_child - own >= CHILD_BYTES * 0.9, (with_child, own, _statm_rss(child.pid))
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)
        assert child.stdout is not None
        child.stdout.close()
        reader.close()


def test_a_kernel_without_children_reads_no_thread_files() -> None:
    """The one-syscall path (ECHILD): with no child, the threads' files are never opened, and the
    reading is still this process's RSS; a child makes the reader look at them again."""
    reader = TreeRss()
    try:
        with contextlib.suppress(ChildProcessError):  # pytest's own children, if any, are reaped
            if os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                pytest.skip("this test process has an unreaped child")
        if _has_children():
            pytest.skip("this test process has children (a session server)")
        assert abs(reader.read() - _statm_rss(os.getpid())) < 1 << 20
        assert reader._children == {}
        child = subprocess.Popen([sys.executable, "-c", "input()"], stdin=subprocess.PIPE)
        try:
            reader.read()
            assert reader._children, "with a child, the threads' children files are read"
        finally:
            assert child.stdin is not None
            child.stdin.close()
            child.wait(timeout=30)
    finally:
        reader.close()


def _has_children() -> bool:
    return bool(psutil.Process().children())
