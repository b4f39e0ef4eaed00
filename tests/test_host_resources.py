"""The host's resources a kernel can hold outside its heap, tried from a cell (Python, ``sh``, a child
process, ctypes) and judged from outside: the file's size as the host sees it through the
supervisor's root, the kernel's process gone and the watchdog's recorded cause, the host's own
inotify instances, the System V segments of the sandbox's IPC namespace read by ``nsenter``.

Sizes stay modest (the machine is shared): limits of 256 MiB, writes of 400 MiB.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import psutil
import pytest
from conftest import gone, wait_until

from ivralo_kernel.host import Session, WorkerConfig
from ivralo_kernel.host.sandbox.limits import inotify_instances_allowed, inotify_watches_allowed

pytestmark = pytest.mark.timeout(180)

MIB = 1 << 20
LIMIT = 256 * MIB
WRITE = 400 * MIB
LIBC = ctypes.CDLL(None, use_errno=True)
CAP_SYS_RESOURCE = 24


def config(**given: object) -> WorkerConfig:
    return WorkerConfig(observer_poll_ms=100, deadline_ms=120_000, **given)


async def sandboxed(session: Session) -> int:
    """The supervisor's pid, once the kernel runs, checked to be in the sandbox."""
    assert await session.run("pass") == ""
    assert session.kernel_info["ivralo"]["layers"]["sandbox"].startswith("bwrap"), session.kernel_info
    assert session.supervisor_pid is not None
    return session.supervisor_pid


WRITERS = {
    "python": f"""
import errno, os, tempfile
path = os.path.join(tempfile.gettempdir(), 'big')  # the kernel's private folder, in the sandbox's /tmp
said = 'written'
with open(path, 'wb') as f:
    for _ in range({WRITE // MIB}):
        try:
            f.write(b'x' * {MIB})
            f.flush()
        except OSError as exc:
            said = errno.errorcode[exc.errno]
            break
print(path, said)
""",
    "sh": f"""
import os, subprocess, tempfile
path = os.path.join(tempfile.gettempdir(), 'big')
r = subprocess.run(['sh', '-c', f'head -c {WRITE} /dev/zero > {{path}}'], capture_output=True, text=True)
print(path, r.stderr)
""",
}


@pytest.mark.parametrize("how", sorted(WRITERS))
async def test_a_write_beyond_the_tmpfs_size_is_refused(workspace: Path, how: str) -> None:
    async with Session(workspace=workspace, config=config(tmpfs_size_bytes=LIMIT)) as session:
        supervisor = await sandboxed(session)
        said = await session.run(WRITERS[how])
        assert isinstance(said, str), said
        path = said.split()[0]
        assert path.startswith("/tmp/"), said
        seen = os.stat(f"/proc/{supervisor}/root{path}")  # the host's view of the sandbox's file
        assert seen.st_blocks * 512 <= LIMIT < WRITE, (seen.st_blocks, said)
        assert "ENOSPC" in said or "No space left" in said, said


async def test_dev_is_read_only(workspace: Path) -> None:
    """bwrap's /dev is a tmpfs with no size: nothing can be written there (with the Landlock floor
    off too, which otherwise refuses the write first)."""
    async with Session(workspace=workspace, config=config(landlock=False)) as session:
        supervisor = await sandboxed(session)
        said = await session.run(
            "import subprocess\nr = subprocess.run(['sh', '-c', 'echo x > /dev/big'], capture_output=True, text=True)\n"
            "print(r.stderr)"
        )
        assert not os.path.exists(f"/proc/{supervisor}/root/dev/big"), said
        assert isinstance(said, str) and "Read-only file system" in said, said


HOLDERS = {
    "a file in the kernel's temp folder": f"""
import os, tempfile, time
with open(os.path.join(tempfile.gettempdir(), 'held'), 'wb') as f:
    for _ in range({WRITE // MIB}):
        f.write(b'x' * {MIB})
print('held', flush=True)
time.sleep(100)
""",
    "a memfd": f"""
import os, time
fd = os.memfd_create('held')
for _ in range({WRITE // MIB}):
    os.write(fd, b'x' * {MIB})
print('held', flush=True)
time.sleep(100)
""",
    "a memfd, mapped and closed": f"""
import mmap, os, time
fd = os.memfd_create('held')
for _ in range({WRITE // MIB}):
    os.write(fd, b'x' * {MIB})
kept = mmap.mmap(fd, {WRITE}, flags=mmap.MAP_SHARED)  # only the mapping holds it now
os.close(fd)
print('held', flush=True)
time.sleep(100)
""",
    "a memfd in a child, by ctypes": f"""
import subprocess, sys
child = '''
import ctypes, os, time
fd = ctypes.CDLL(None).memfd_create(b"held", 0)
for _ in range({WRITE // MIB}):
    os.write(fd, b"x" * {MIB})
print("held", flush=True)
time.sleep(100)
'''
p = subprocess.Popen([sys.executable, '-c', child], stdout=subprocess.PIPE, text=True)
print(p.stdout.readline(), flush=True)
p.wait()
""",
    "a file in the kernel's temp folder, from sh": f"""
import subprocess, tempfile
subprocess.run(['sh', '-c', f'head -c {WRITE} /dev/zero > {{tempfile.gettempdir()}}/held; sleep 100'])
""",
}


@pytest.mark.parametrize("what", sorted(HOLDERS))
async def test_memory_held_outside_rss_counts_toward_the_hard_limit(workspace: Path, what: str) -> None:
    # The tmpfs is larger than the hard limit here, so the write itself succeeds and only the
    # observer can stop it.
    settings = config(memory_hard_limit_bytes=LIMIT, memory_soft_limit_bytes=None, tmpfs_size_bytes=2 * WRITE)
    async with Session(workspace=workspace, config=settings) as session:
        await sandboxed(session)
        kernel = session.pid
        assert kernel is not None
        result = await session.run(HOLDERS[what])
        # The host's answer, written by its watchdog when it ended the tree (the kernel says nothing).
        assert isinstance(result, dict), result
        error = result["error"]
        assert error.startswith("REPL worker terminated (memory: RSS "), error
        assert "in files on tmpfs and shared memory" in error, error
        assert f"exceeded memory_hard_limit_bytes={LIMIT}" in error, error
        wait_until(lambda: gone(kernel), 10, "the killed kernel to be gone")


def _inotify_instances(pids: list[int]) -> int:
    count = 0
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                count += os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:inotify"
            except OSError:
                continue
    return count


def _tree(root: int) -> list[int]:
    try:
        proc = psutil.Process(root)
        return [root, *(p.pid for p in proc.children(recursive=True))]
    except psutil.Error:
        return []


def _host_can_watch(n: int) -> bool:
    """Whether this test process (the host's user) can still make ``n`` inotify instances."""
    fds = []
    try:
        for _ in range(n):
            fd = LIBC.inotify_init1(os.O_CLOEXEC)
            if fd < 0:
                return False
            fds.append(fd)
        return True
    finally:
        for fd in fds:
            os.close(fd)


TAKE_INOTIFY = """
import ctypes, errno, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
held = []
while len(held) < 200:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    held.append(fd)
child = '''
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
fds = [libc.inotify_init1(0) for _ in range(200)]
print(sum(fd >= 0 for fd in fds), flush=True)
time.sleep(100)
'''
p = subprocess.Popen([sys.executable, '-c', child], stdout=subprocess.PIPE, text=True)
print(len(held), p.stdout.readline().strip())
"""


async def test_a_kernel_s_inotify_instances_leave_the_user_s_own(workspace: Path) -> None:
    share = inotify_instances_allowed()
    assert _host_can_watch(8), "this machine's user is out of inotify instances before the test"
    async with Session(workspace=workspace, config=config()) as session:
        supervisor = await sandboxed(session)
        said = await session.run(TAKE_INOTIFY)
        held = _inotify_instances(_tree(supervisor))  # counted from outside, while the kernel holds them
        assert 0 < held <= share, (held, share, said)
        assert _host_can_watch(8), f"the kernel's {held} inotify instances left the host's user none"


async def test_the_kernel_cannot_raise_its_namespace_limits(workspace: Path) -> None:
    """The supervisor's CAP_SYS_RESOURCE (for writing the limits) is gone before the kernel starts:
    no process of the tree has it in any set, and a write from a cell changes nothing."""
    async with Session(workspace=workspace, config=config()) as session:
        supervisor = await sandboxed(session)
        await session.run(
            "import subprocess\nsubprocess.run(['sh', '-c', 'echo 100000 > /proc/sys/user/max_inotify_instances'])"
        )
        for pid in _tree(supervisor)[1:]:  # bwrap's own process outside the namespace is not ours
            with open(f"/proc/{pid}/status", encoding="ascii") as f:
                caps = {k: int(v, 16) for k, _, v in (line.partition(":\t") for line in f) if k.startswith("Cap")}
            # The bounding set matters to root alone (exec gives root the bounding set); another user
            # gets only ambient capabilities across exec, under bwrap's no_new_privs.
            sets = [k for k in caps if k != "CapBnd" or os.stat(f"/proc/{pid}").st_uid == 0]
            assert not any(caps[k] & (1 << CAP_SYS_RESOURCE) for k in sets), (pid, caps)
        said = await session.run(TAKE_INOTIFY)
        assert _inotify_instances(_tree(supervisor)) <= inotify_instances_allowed(), said


SYSV = f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
ids = []
for size in ({WRITE}, {LIMIT}, 64 << 20):
    shm = libc.shmget(0, size, 0o1600)
    if shm >= 0:
        addr = libc.shmat(shm, None, 0)
        ctypes.memset(addr, 1, size)
        libc.shmdt(ctypes.c_void_p(addr))  # detached: no process's RSS shows it now
        ids.append(size)
print(ids)
"""


async def test_system_v_shared_memory_is_capped(workspace: Path) -> None:
    nsenter = shutil.which("nsenter")
    if nsenter is None:
        pytest.fail("nsenter (util-linux) is needed to read the sandbox's System V segments from outside")
    async with Session(workspace=workspace, config=config(tmpfs_size_bytes=LIMIT)) as session:
        supervisor = await sandboxed(session)
        await session.run(SYSV)
        listed = subprocess.run(
            [nsenter, f"--ipc=/proc/{supervisor}/ns/ipc", "cat", "/proc/sysvipc/shm"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.splitlines()[1:]
        sizes = [int(line.split()[3]) for line in listed if line.strip()]
        assert sum(sizes) <= 64 * MIB, sizes


async def test_in_the_fallback_the_observer_ends_a_kernel_that_takes_the_user_s_inotify(workspace: Path) -> None:
    """Without a sandbox there is no namespace of the kernel's own to set a limit in: the host's
    observer counts the tree's instances and ends it above its share."""
    async with Session(workspace=workspace, config=config(sandbox="off")) as session:
        assert await session.run("pass") == ""
        assert not session.kernel_info["ivralo"]["layers"]["sandbox"].startswith("bwrap")
        kernel = session.pid
        assert kernel is not None
        result = await session.run(TAKE_INOTIFY + "import time\ntime.sleep(100)\n")
        assert isinstance(result, dict), result
        assert result["error"].startswith("REPL worker terminated (inotify: "), result
        wait_until(lambda: gone(kernel), 10, "the killed kernel to be gone")
        assert _host_can_watch(8)


TAKE_WATCHES = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
watcher = libc.inotify_init1(0)
added, refused = 0, 0
for folder, dirs, files in os.walk('/usr'):
    for name in files + dirs:
        if libc.inotify_add_watch(watcher, os.path.join(folder, name).encode(), 0x2) < 0:  # IN_MODIFY
            refused = ctypes.get_errno()
            break
        added += 1
    if refused:
        break
print(added, errno.errorcode.get(refused, refused))
"""


def _watches(pids: list[int]) -> int:
    count = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fdinfo"):
                with contextlib.suppress(OSError), open(f"/proc/{pid}/fdinfo/{fd}", encoding="ascii") as f:
                    count += sum(line.startswith("inotify wd:") for line in f)
    return count


async def test_a_kernel_s_inotify_watches_leave_the_user_s_own(workspace: Path) -> None:
    share = inotify_watches_allowed()
    async with Session(workspace=workspace, config=config()) as session:
        supervisor = await sandboxed(session)
        said = await session.run(TAKE_WATCHES)
        held = _watches(_tree(supervisor))  # counted from outside, in the kernel's fdinfo
        assert 0 < held <= share, (held, share, said)
        fd = LIBC.inotify_init1(os.O_CLOEXEC)
        assert fd >= 0, "the host's user has no inotify instance left"
        try:
            added = [
                LIBC.inotify_add_watch(fd, str(path).encode(), 0x2) for path in list(Path("/usr/bin").iterdir())[:50]
            ]
            assert min(added) >= 0, f"the kernel's {held} watches left the host's user none"
        finally:
            os.close(fd)
