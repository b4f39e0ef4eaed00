"""seccomp, in the sandbox and in the fallback: the kernel interfaces no notebook needs, tried by
ctypes and by ``sh``, and judged from outside the kernel: the host reads the kernel's tree in
``/proc`` (the descriptors each process holds, the namespaces each lives in, who traces whom) and
the host's own keyring. Unix sockets of the machine and the terminal are tried in
``test_unix_sockets.py`` and ``test_terminal.py``."""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import FALLBACK_KERNEL, SANDBOXED_KERNEL
from kernel_helpers import execute
from sandbox_cases import started_kernel

from ivralo_kernel.protocol.sandbox import seccomp
from ivralo_kernel.protocol.sandbox.bpf import BpfError, Program

ARCH = seccomp.this_arch()
pytestmark = pytest.mark.skipif(ARCH is None, reason="seccomp filters are built for x86_64 and aarch64 only")
MODES = (SANDBOXED_KERNEL, FALLBACK_KERNEL)
SYS_PIDFD_OPEN, SYS_PIDFD_GETFD = 434, 438  # the unified table
KEY_SPEC_SESSION_KEYRING = -3
KEYCTL_UNLINK = 9

# What the cell tries by ctypes. Every descriptor it gets stays open and every child keeps running,
# so the host can see what was obtained; the cell's own words are not the judge.
PROBE = r"""
import ctypes, errno, os, subprocess, sys, time
libc = ctypes.CDLL(None, use_errno=True)
NR = {nr!r}
held, said = [], []
def attempt(name, *args):
    r = libc.syscall(NR[name], *args)
    said.append(f"{{name}}={{r}}/{{errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())}}")
    if r >= 0:
        held.append(r)
params = ctypes.create_string_buffer(120)
attempt("io_uring_setup", 4, params)
attempt("userfaultfd", 1)  # UFFD_USER_MODE_ONLY: allowed to anyone without the filter
attr = ctypes.create_string_buffer(128)
ctypes.memmove(attr, (ctypes.c_uint32 * 4)(1, 0, 128, 0), 16)  # type HARDWARE, size, config CPU_CYCLES
ctypes.memmove(ctypes.addressof(attr) + 40, (ctypes.c_uint64 * 1)(1 | 1 << 5 | 1 << 6), 8)  # disabled, excl
attempt("perf_event_open", attr, 0, -1, -1, 0)
bpf_attr = ctypes.create_string_buffer(128)
ctypes.memmove(bpf_attr, (ctypes.c_uint32 * 4)(2, 4, 4, 1), 16)  # BPF_MAP_TYPE_ARRAY, 4-byte keys/values, 1
attempt("bpf", 0, bpf_attr, 128)  # BPF_MAP_CREATE
attempt("socket", 40, 1, 0)  # AF_VSOCK (created only, never connected)
attempt("clone3", None, 0)
key = {key!r}.encode()
attempt("add_key", b"user", key, b"from-the-kernel", 15, -3)
buf = ctypes.create_string_buffer(256)
serial = libc.syscall(NR["request_key"], b"user", {host_key!r}.encode(), None, -3)
n = libc.syscall(NR["keyctl"], 11, serial, buf, 256)  # KEYCTL_READ of the host's key
open("keyring-read.txt", "wb").write(buf.raw[: max(n, 0)])
open("keys-listed.txt", "w").write(open("/proc/keys").read())
# Each child says "tried" once its attempt is made (in the new namespace, or after a refusal), then
# stays: the cell waits for that line from each, so the host looks after every attempt.
def child(argv):
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
stay = "echo tried; exec sleep 60"
children = [
    child(["sh", "-c", f"unshare -Ur sh -c '{{stay}}' || {{{{ {{stay}}; }}}}"]),
    child(["sh", "-c", f"unshare -m sh -c '{{stay}}' || {{{{ {{stay}}; }}}}"]),
    child([sys.executable, "-c", "import ctypes, time; ctypes.CDLL(None).unshare(0x10000000 | 0x20000);"
        "print('tried', flush=True); time.sleep(60)"]),
]
target = subprocess.Popen(["sleep", "60"])
children.append(child([sys.executable, "-c", f"import ctypes, time; ctypes.CDLL(None).ptrace(16, {{target.pid}}, 0, 0);"
    "print('tried', flush=True); time.sleep(60)"]))
said += [c.stdout.readline().strip() for c in children]
print(" ".join(said))
"""


def _descendants(pid: int) -> list[psutil.Process]:
    return [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]


def _fd_kinds(proc: psutil.Process) -> list[str]:
    """What each descriptor of ``proc`` is (``anon_inode:[io_uring]``, ``socket:[..]`` with its family)."""
    kinds = []
    with contextlib.suppress(psutil.Error, OSError):
        for fd in os.listdir(f"/proc/{proc.pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{proc.pid}/fd/{fd}")
                if link.startswith("socket:"):
                    link += f" family={_socket_family(proc.pid, int(fd))}"
                kinds.append(link)
    return kinds


def _socket_family(pid: int, fd: int) -> int:
    """The family of another process's socket, read on a copy of its descriptor (pidfd_getfd)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = libc.syscall(SYS_PIDFD_OPEN, pid, 0)
    if pidfd < 0:
        return -1
    try:
        mine = libc.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
        if mine < 0:
            return -1
        with socket.socket(fileno=mine) as s:
            return int(s.family)
    finally:
        os.close(pidfd)


@pytest.fixture
def host_key() -> Iterator[str]:
    """A key in this process's session keyring, which the kernel's tree shares unless it has its own."""
    libc = ctypes.CDLL(None, use_errno=True)
    name = f"ivralo-host-{uuid.uuid4().hex[:8]}"
    secret = b"host-keyring-secret-" + uuid.uuid4().hex.encode()
    serial = libc.syscall(ARCH.nr("add_key"), b"user", name.encode(), secret, len(secret), KEY_SPEC_SESSION_KEYRING)
    if serial < 0:
        pytest.skip(f"this process has no session keyring to put a key in (errno {ctypes.get_errno()})")
    yield name + "\n" + secret.decode()
    libc.syscall(ARCH.nr("keyctl"), KEYCTL_UNLINK, serial, KEY_SPEC_SESSION_KEYRING)


@pytest.mark.parametrize("kernel_name", MODES)
@pytest.mark.timeout(180)
def test_kernel_interfaces_are_refused(kernel_name: str, workspace: Path, host_key: str) -> None:
    assert ARCH is not None
    key_name, secret = host_key.split("\n")
    new_key = f"ivralo-kernel-{uuid.uuid4().hex[:8]}"
    names = ("io_uring_setup", "userfaultfd", "perf_event_open", "bpf", "socket", "clone3")
    nr = {name: ARCH.nr(name) for name in (*names, "add_key", "request_key", "keyctl")}
    with started_kernel(kernel_name, workspace) as (km, kc):
        layers = kc.kernel_info(reply=True, timeout=30)["content"]["ivralo"]
        kernel = km.provisioner.host_pid(int(layers["pid"]))  # type: ignore[union-attr]
        by = "bwrap" if kernel_name == SANDBOXED_KERNEL else "supervisor"  # before any code of the kernel runs
        assert layers["layers"]["seccomp"].endswith(f"installed by {by}"), layers["layers"]["seccomp"]
        assert layers["layers"]["unix_sockets"].startswith("closed: no new AF_UNIX socket"), layers["layers"]
        assert "not bound within" not in layers["layers"]["unix_sockets"], "the filter waited for the heartbeat"
        done = execute(kc, PROBE.format(nr=nr, key=new_key, host_key=key_name), timeout=60)
        assert done.status == "ok", done.outputs
        tree = _descendants(kernel)
        own = {os.readlink(f"/proc/{kernel}/ns/{ns}") for ns in ("user", "mnt")}
        kinds = [kind for proc in tree for kind in _fd_kinds(proc)]
        namespaces = {
            (proc.pid, ns): os.readlink(f"/proc/{proc.pid}/ns/{ns}")
            for proc in tree
            for ns in ("user", "mnt")
            if proc.is_running()
        }
        tracers = [
            line
            for proc in tree
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines()
            if line.startswith("TracerPid:") and line.split()[1] != "0"
        ]
    said = done.stdout
    for kind in ("anon_inode:[io_uring]", "anon_inode:[userfaultfd]", "anon_inode:[perf_event]", "anon_inode:bpf"):
        assert not [k for k in kinds if k.startswith(kind)], f"{kind} obtained in the kernel's tree: {said}"
    assert not [k for k in kinds if k.endswith("family=40")], f"an AF_VSOCK socket in the kernel's tree: {said}"
    # Not root, the host cannot copy a descriptor of a kernel that shares its user namespace (the
    # fallback's, not dumpable): then the cell's EPERM below is all there is to judge by.
    unknown = [k for k in kinds if k.endswith("family=-1")]
    assert not unknown or os.geteuid() != 0, f"the host could not read these sockets' families: {unknown}"
    assert set(namespaces.values()) <= own, f"a process of the tree made a namespace of its own: {said}"
    assert not tracers, f"a process of the tree is traced: {tracers}"
    assert new_key not in Path("/proc/keys").read_text(), f"the kernel added a key to a keyring: {said}"
    assert secret.encode() not in (workspace / "keyring-read.txt").read_bytes(), "the host's key was read"
    if kernel_name == SANDBOXED_KERNEL:  # in the fallback /proc/keys is the host's (names, never contents)
        assert key_name not in (workspace / "keys-listed.txt").read_text(), "the host's key is listed by name"
    assert "clone3=-1/ENOSYS" in said, f"clone3 says ENOSYS (glibc then uses clone): {said}"
    for name in ("io_uring_setup", "userfaultfd", "perf_event_open", "bpf", "socket", "add_key"):
        assert f"{name}=-1/EPERM" in said, f"{name} is refused with EPERM, not a kill: {said}"


@pytest.mark.parametrize("kernel_name", MODES)
@pytest.mark.timeout(120)
def test_what_notebooks_use_still_works(kernel_name: str, workspace: Path) -> None:
    """Threads, processes (fork, spawn, posix_spawn), a pty (IPython's ``!``), sockets on loopback
    and socketpairs run under both filters."""
    code = r"""
import multiprocessing as mp, os, socket, subprocess, threading
t = threading.Thread(target=lambda: None); t.start(); t.join()
def through(method):
    ctx = mp.get_context(method)
    mine, theirs = ctx.Pipe()
    child = ctx.Process(target=theirs.send, args=(method,)); child.start()
    got = mine.recv(); child.join(30)
    return got
forked, spawned = through("fork"), through("spawn")
pair = socket.socketpair(); pair[0].send(b"x"); got = pair[1].recv(1)
server = socket.create_server(("127.0.0.1", 0)); port = server.getsockname()[1]
if os.environ.get("IVRALO_SANDBOX") == "bwrap":  # the fallback's TCP rule allows only the proxy's port
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
shell = subprocess.run(["sh", "-c", "echo shell-ok"], capture_output=True, text=True).stdout.strip()
bang = get_ipython().getoutput("echo bang-ok")
import matplotlib
matplotlib.use("agg")
import matplotlib.pyplot as plt
plt.plot([1, 2]); plt.savefig("plot.png")
open("works.txt", "w").write(f"{forked} {spawned} {got!r} {shell} {bang}")
"""
    with started_kernel(kernel_name, workspace) as (_, kc):
        done = execute(kc, code, timeout=90)
    assert done.status == "ok", "\n".join(done.reply["content"].get("traceback", []))
    assert (workspace / "works.txt").read_text() == "fork spawn b'x' shell-ok ['bang-ok']"
    assert (workspace / "plot.png").read_bytes().startswith(b"\x89PNG"), "matplotlib draws"


@pytest.mark.fast
def test_the_filter_checks_its_architecture() -> None:
    """A system call of another ABI has other numbers: the filter ends that process, and refuses
    x32's calls on x86_64; everything else is an error, never a kill."""
    assert ARCH is not None
    program = seccomp.base_filter(ARCH)
    words = [int.from_bytes(program[i + 4 : i + 8], "little") for i in range(0, len(program), 8)]
    assert program[:8] == bytes([0x20, 0, 0, 0]) + (4).to_bytes(4, "little"), "it loads the arch first"
    assert words[1] == ARCH.audit
    returns = [w for i, w in enumerate(words) if program[8 * i] == 0x06]
    assert seccomp.SECCOMP_RET_KILL_PROCESS in returns
    others = {w for w in returns if w != seccomp.SECCOMP_RET_KILL_PROCESS}
    assert others == {seccomp.SECCOMP_RET_ALLOW, seccomp.SECCOMP_RET_ERRNO | 1, seccomp.SECCOMP_RET_ERRNO | 38}


MOUNTS = r"""
import ctypes, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs("mnt", exist_ok=True)
said = []
for name, call in (
    ("umount2(.git)", lambda: libc.umount2(b".git", 2)),  # MNT_DETACH
    ("mount(tmpfs)", lambda: libc.mount(b"{tag}", b"mnt", b"tmpfs", 0, None)),
    ("fsopen(tmpfs)", lambda: libc.syscall({fsopen}, b"tmpfs", 0)),
):
    said.append(f"{{name}}={{call()}}/{{ctypes.get_errno()}}")
r = subprocess.run(["sh", "-c", "umount .git; umount -l .git; mount -t tmpfs {tag} mnt; echo evil >> .git/config"],
                   capture_output=True, text=True)
print(" ".join(said), r.stderr)
"""


@pytest.mark.parametrize("kernel_name", MODES)
@pytest.mark.timeout(120)
def test_no_mount_is_made_or_removed(kernel_name: str, workspace: Path) -> None:
    """As root the sandbox keeps its user namespace's capabilities, and there ``umount .git`` takes
    the read-only mount away (the next write lands in the real file). Landlock, when on, refuses
    changes to the mount table too, but not ``fsopen``; the filter refuses all of them, with EPERM."""
    assert ARCH is not None
    (workspace / ".git").mkdir()
    (workspace / ".git" / "config").write_text("[core]\n")
    tag = f"ivralo-{uuid.uuid4().hex[:8]}"
    with started_kernel(kernel_name, workspace) as (km, kc):
        kernel = km.provisioner.host_pid(int(kc.kernel_info(reply=True, timeout=30)["content"]["ivralo"]["pid"]))  # type: ignore[union-attr]
        done = execute(kc, MOUNTS.format(tag=tag, fsopen=ARCH.nr("fsopen")), timeout=60)
        mounts = Path(f"/proc/{kernel}/mountinfo").read_text()
    if tag in Path("/proc/self/mountinfo").read_text():  # the fallback shares our mount namespace
        subprocess.run(["umount", "-l", str(workspace / "mnt")], check=False, timeout=30)
    assert tag not in mounts, f"a tmpfs was mounted in the kernel's namespace: {done.stdout}"
    said = done.stdout
    assert "umount2(.git)=-1/1" in said and "mount(tmpfs)=-1/1" in said and "fsopen(tmpfs)=-1/1" in said, said
    if kernel_name == SANDBOXED_KERNEL:
        assert (workspace / ".git" / "config").read_text() == "[core]\n", f".git/config was written: {said}"


@pytest.mark.fast
def test_the_assembler_refuses_what_classic_bpf_cannot_do() -> None:
    far = Program()
    far.jump_if_equal(1, "end")
    for _ in range(300):
        far.load(0)
    far.label("end")
    far.ret(seccomp.SECCOMP_RET_ALLOW)
    with pytest.raises(BpfError, match=r"classic BPF: 0\.\.255"):
        far.assemble()
    unknown = Program()
    unknown.jump_if_equal(1, "nowhere")
    unknown.ret(seccomp.SECCOMP_RET_ALLOW)
    with pytest.raises(BpfError, match="unknown label 'nowhere'"):
        unknown.assemble()
    endless = Program()
    endless.load(0)
    with pytest.raises(BpfError, match="must end with a return"):
        endless.assemble()
