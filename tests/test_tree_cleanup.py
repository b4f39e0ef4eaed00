"""Nothing outlives the kernel: plain children, setsid children and double-forked daemons are gone
within 2 s of a shutdown, a crash of the kernel, or SIGKILL of the host process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from conftest import gone, kernel_cgroups, wait_until
from jupyter_client import KernelManager
from kernel_helpers import execute

from ivralo_kernel.host.sandbox.memory_cgroup import PREFIX, find_place, sweep

SPAWN_CHILDREN = """
import json, os, subprocess, sys
plain = subprocess.Popen(['sleep', '301'])
session = subprocess.Popen(['sleep', '302'], start_new_session=True)
# double fork: the middle process exits at once, the daemon is orphaned (and in its own session)
middle = ("import subprocess as s; p = s.Popen(['sleep', '303'], start_new_session=True,"
          " stdout=s.DEVNULL, stderr=s.DEVNULL); print(p.pid)")
daemon = subprocess.run([sys.executable, '-c', middle], capture_output=True, text=True).stdout.strip()
print(json.dumps({'kernel': os.getpid(), 'children': [plain.pid, session.pid, int(daemon)]}))
"""

HOST_SCRIPT = """
import json, os, sys
sys.path.insert(0, {tests!r})
from jupyter_client import KernelManager
from kernel_helpers import execute
km = KernelManager(kernel_name='ivralo')
km.start_kernel(cwd={workspace!r})
kc = km.client(); kc.start_channels(); kc.wait_for_ready(timeout=60)
pids = json.loads(execute(kc, {code!r}).stdout)
# The kernel reports its pids as its sandbox sees them: these are the host's.
pids['kernel'] = km.provisioner.host_pid(pids['kernel'])
pids['children'] = [km.provisioner.host_pid(p) for p in pids['children']]
pids['supervisor'] = km.provisioner.supervisor_pid()
print(json.dumps(pids), flush=True)
sys.stdin.read()  # wait to be killed
"""


def _start(workspace: Path) -> tuple[KernelManager, dict[str, object]]:
    km = KernelManager(kernel_name="ivralo")
    km.start_kernel(cwd=str(workspace))
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    pids = json.loads(execute(kc, SPAWN_CHILDREN).stdout)
    # The kernel reports its pids as its sandbox sees them: these are the host's.
    pids["kernel"] = km.provisioner.host_pid(pids["kernel"])
    pids["children"] = [km.provisioner.host_pid(pid) for pid in pids["children"]]  # type: ignore[attr-defined]
    pids["supervisor"] = km.provisioner.supervisor_pid()
    kc.stop_channels()
    for pid in pids["children"]:
        assert psutil.pid_exists(pid)
    return km, pids


def _all_pids(pids: dict[str, object]) -> list[int]:
    return [pids["kernel"], pids["supervisor"], *pids["children"]]  # type: ignore[list-item]


def test_daemon_is_adopted_by_the_supervisor(workspace: Path) -> None:
    km, pids = _start(workspace)
    try:
        daemon = psutil.Process(pids["children"][2])  # type: ignore[index]
        assert daemon.ppid() == pids["supervisor"], "the supervisor (subreaper) adopts orphans"
    finally:
        km.shutdown_kernel(now=True)


@pytest.mark.parametrize("now", [False, True], ids=["graceful", "now"])
def test_shutdown_ends_the_whole_tree(workspace: Path, now: bool) -> None:
    km, pids = _start(workspace)
    km.shutdown_kernel(now=now)
    for pid in _all_pids(pids):
        wait_until(lambda pid=pid: gone(pid), 2, f"pid {pid} to be gone after shutdown")


def test_kernel_crash_ends_the_whole_tree(workspace: Path) -> None:
    km, pids = _start(workspace)
    try:
        kc = km.client()
        kc.start_channels()
        kc.execute("import os; os._exit(3)")
        for pid in _all_pids(pids):
            wait_until(lambda pid=pid: gone(pid), 2, f"pid {pid} to be gone after the kernel crashed")
        wait_until(lambda: km.provisioner.process.poll() is not None, 2, "the supervisor to exit")
        assert km.provisioner.process.poll() == 3, "the supervisor exits with the kernel's status"
        kc.stop_channels()
    finally:
        km.shutdown_kernel(now=True)


def test_sigkill_of_the_host_ends_the_whole_tree(workspace: Path) -> None:
    tests = str(Path(__file__).parent)
    script = HOST_SCRIPT.format(tests=tests, workspace=str(workspace), code=SPAWN_CHILDREN)
    with subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as host:
        try:
            line = host.stdout.readline()  # type: ignore[union-attr]
            assert line, "the host script printed no pids"
            pids = json.loads(line)
            for pid in _all_pids(pids):
                assert psutil.pid_exists(pid)
            os.kill(host.pid, signal.SIGKILL)
            host.wait(timeout=10)
            for pid in _all_pids(pids):
                wait_until(lambda pid=pid: gone(pid), 2, f"pid {pid} to be gone after SIGKILL of the host")
        finally:
            if host.poll() is None:
                host.kill()
    # A host killed outright cannot remove its kernel's memory cgroup (empty now): the next start's
    # sweep does (host/sandbox/memory_cgroup.py). Where none is made (cgroup v1 here), nothing to sweep.
    place = find_place()
    if place.parent:
        left = [g for g in kernel_cgroups() if os.path.basename(g).startswith(f"{PREFIX}{host.pid}-")]
        swept = sweep(place.parent)
        assert set(left) <= set(swept) and not any(map(os.path.exists, left)), (left, swept)
