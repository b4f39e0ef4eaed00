"""[protocol] The kernel's seccomp filters: what they refuse, built for this machine, and installed.

Two filters, both answering a refused call with an error (never a kill), so a program that tries
one fails the way it would on a kernel without the feature:

* :func:`base_filter`, on the supervisor and everything under it (bwrap loads it with
  ``--seccomp FD`` after building the sandbox; in the fallback the supervisor installs it before it
  starts the kernel). It closes kernel interfaces no notebook needs and that comparable sandboxes
  (Docker's default profile, Chromium, sandbox-runtime) close: io_uring, the kernel's keyrings,
  bpf, perf events, userfaultfd, AF_VSOCK, new namespaces and mounts (``clone3`` says ENOSYS, as
  in Docker, so glibc falls back to ``clone``, whose flags a classic filter can read), ptrace and
  reads of other processes' memory, kernel modules and kexec, and the terminal ioctls that type
  into a terminal (TIOCSTI, TIOCLINUX).
  In the fallback (no sandbox, so no network namespace of its own: ``fallback=True``) it also keeps
  the network to TCP, the one protocol Landlock's connect rule and the egress proxy judge: an
  AF_INET/AF_INET6 socket must be a TCP stream (no UDP, so no DNS of its own, no raw or ICMP
  socket, no MPTCP or SCTP), only the families the kernel's tree uses (unix, inet, inet6, netlink)
  can be made (no AF_PACKET, Bluetooth, CAN, ...), and TCP Fast Open, whose SYN carries data past
  Landlock's connect hook, is refused (``MSG_FASTOPEN`` on a send, ``TCP_FASTOPEN_CONNECT``).
* :func:`unix_socket_filter`, on the kernel process once its own Jupyter sockets are bound (all
  its threads at once, TSYNC), and so on every process it starts: no new AF_UNIX socket, so no
  unix socket of the machine can be reached wherever it lives (a read-only mount does not stop
  ``connect``). A stream or seqpacket ``socketpair`` stays open (a connected pair reaches nothing);
  a datagram pair is refused (its ends could ``sendto`` a datagram socket by path).

Each filter first checks the architecture in ``seccomp_data``: a system call of another ABI (a
32-bit program on x86_64) has other numbers, which this filter cannot judge, so it ends the
process; x32 calls on x86_64 are refused.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from ivralo_kernel.protocol.sandbox.bpf import Program

SECCOMP_RET_KILL_PROCESS: Final = 0x80000000
SECCOMP_RET_ERRNO: Final = 0x00050000
SECCOMP_RET_ALLOW: Final = 0x7FFF0000
SECCOMP_SET_MODE_FILTER: Final = 1
SECCOMP_FILTER_FLAG_TSYNC: Final = 1
PR_SET_NO_NEW_PRIVS: Final = 38

# struct seccomp_data: nr (u32), arch (u32), instruction_pointer (u64), args[6] (u64, native order:
# the low 32 bits of an argument come first on both little-endian targets below).
_NR, _ARCH, _ARGS = 0, 4, 16

AF_UNIX: Final = 1
AF_INET: Final = 2
AF_INET6: Final = 10
AF_NETLINK: Final = 16  # glibc's getaddrinfo reads the interfaces' addresses through it (AI_ADDRCONFIG)
AF_VSOCK: Final = 40
SOCK_STREAM: Final = 1
SOCK_DGRAM: Final = 2
IPPROTO_UDP: Final = 17
IPPROTO_TCP: Final = 6
MSG_FASTOPEN: Final = 0x20000000
TCP_FASTOPEN_CONNECT: Final = 30
SOCK_SEQPACKET: Final = 5
SOCK_TYPE_MASK: Final = 0xF
TIOCSTI: Final = 0x5412  # push a byte into the terminal's input: types a command into its shell
TIOCLINUX: Final = 0x541C  # the virtual console's selection paste does the same
USERFAULTFD_IOC_NEW: Final = 0xAA00  # /dev/userfaultfd's way to a userfaultfd
# clone()'s low byte is the exit signal, so CLONE_NEWTIME (0x80) is refused for unshare only.
CLONE_NEW_NAMESPACES: Final = 0x7E020000  # NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
CLONE_NEWTIME: Final = 0x80

# Refused whole, with EPERM, and why (the docs' table is this one).
REFUSED: Final = MappingProxyType(
    {
        "io_uring_setup": "io_uring: a second way into the kernel, the source of many escapes",
        "io_uring_enter": "io_uring",
        "io_uring_register": "io_uring",
        "keyctl": "the kernel's keyrings: the host's session keyring is readable otherwise",
        "add_key": "the kernel's keyrings",
        "request_key": "the kernel's keyrings",
        "bpf": "eBPF programs",
        "perf_event_open": "perf events (side channels, kernel bugs)",
        "userfaultfd": "userfaultfd (stalls the kernel at will, a tool of exploits)",
        "setns": "joining other namespaces",
        "mount": "mounts (a new namespace would allow them)",
        "umount2": "mounts",
        "pivot_root": "mounts",
        "open_tree": "the new mount API",
        "move_mount": "the new mount API",
        "fsopen": "the new mount API",
        "fsconfig": "the new mount API",
        "fsmount": "the new mount API",
        "fspick": "the new mount API",
        "mount_setattr": "the new mount API",
        "ptrace": "tracing another process (its memory, its registers)",
        "process_vm_readv": "reading another process's memory",
        "process_vm_writev": "writing another process's memory",
        "pidfd_getfd": "copying another process's descriptors (the supervisor's link to the egress proxy)",
        "kexec_load": "loading a new kernel",
        "kexec_file_load": "loading a new kernel",
        "init_module": "kernel modules",
        "finit_module": "kernel modules",
        "delete_module": "kernel modules",
        "open_by_handle_at": "opening files by handle, around the mount table",
    }
)

_X86_64: Final = MappingProxyType(
    {
        "ioctl": 16,
        "socket": 41,
        "sendto": 44,
        "sendmsg": 46,
        "socketpair": 53,
        "setsockopt": 54,
        "clone": 56,
        "ptrace": 101,
        "pivot_root": 155,
        "mount": 165,
        "umount2": 166,
        "init_module": 175,
        "delete_module": 176,
        "kexec_load": 246,
        "add_key": 248,
        "request_key": 249,
        "keyctl": 250,
        "unshare": 272,
        "perf_event_open": 298,
        "open_by_handle_at": 304,
        "setns": 308,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "sendmmsg": 307,
        "finit_module": 313,
        "seccomp": 317,
        "kexec_file_load": 320,
        "bpf": 321,
        "userfaultfd": 323,
    }
)
_AARCH64: Final = MappingProxyType(
    {
        "ioctl": 29,
        "umount2": 39,
        "mount": 40,
        "pivot_root": 41,
        "unshare": 97,
        "kexec_load": 104,
        "init_module": 105,
        "delete_module": 106,
        "ptrace": 117,
        "socket": 198,
        "socketpair": 199,
        "sendto": 206,
        "setsockopt": 208,
        "sendmsg": 211,
        "add_key": 217,
        "request_key": 218,
        "keyctl": 219,
        "clone": 220,
        "perf_event_open": 241,
        "open_by_handle_at": 265,
        "setns": 268,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "sendmmsg": 269,
        "finit_module": 273,
        "seccomp": 277,
        "bpf": 280,
        "userfaultfd": 282,
        "kexec_file_load": 294,
    }
)
# The unified table (>= 424) is the same on every architecture.
_UNIFIED: Final = MappingProxyType(
    {
        "io_uring_setup": 425,
        "io_uring_enter": 426,
        "io_uring_register": 427,
        "open_tree": 428,
        "move_mount": 429,
        "fsopen": 430,
        "fsconfig": 431,
        "fsmount": 432,
        "fspick": 433,
        "clone3": 435,
        "pidfd_getfd": 438,
        "mount_setattr": 442,
    }
)


@dataclass(frozen=True)
class Arch:
    name: str
    audit: int  # AUDIT_ARCH_* in seccomp_data.arch
    numbers: MappingProxyType[str, int]
    x32_bit: int = 0  # x86_64's x32 ABI marks its numbers with this bit

    def nr(self, name: str) -> int:
        return self.numbers.get(name) or _UNIFIED[name]


ARCHES: Final = MappingProxyType(
    {
        "x86_64": Arch("x86_64", 0xC000003E, _X86_64, x32_bit=0x40000000),
        "aarch64": Arch("aarch64", 0xC00000B7, _AARCH64),
    }
)


class SeccompUnavailable(OSError):
    """No filter can be installed here; the message says why."""


def this_arch() -> Arch | None:
    """The architecture of this process's system calls, if a filter can be built for it (a 32-bit
    Python on a 64-bit kernel has other numbers)."""
    if struct.calcsize("P") != 8:
        return None
    return ARCHES.get(os.uname().machine)


def _errno(value: int) -> int:
    return SECCOMP_RET_ERRNO | value


def _start(arch: Arch, program: Program) -> None:
    program.load(_ARCH)
    program.jump_if_equal(arch.audit, None, "foreign")
    program.load(_NR)
    if arch.x32_bit:
        program.jump_if_at_least(arch.x32_bit, "eperm")


def _arg(index: int) -> int:
    return _ARGS + 8 * index  # the low 32 bits: every argument judged here is an int or smaller


def _end(program: Program) -> None:
    program.label("foreign")
    program.ret(SECCOMP_RET_KILL_PROCESS)
    program.label("eperm")
    program.ret(_errno(errno.EPERM))
    program.label("enosys")
    program.ret(_errno(errno.ENOSYS))


def base_filter(arch: Arch, *, fallback: bool = False, udp: bool = False) -> bytes:
    """The filter for the supervisor and everything under it (see the module's docstring);
    ``fallback``: outside a sandbox, where it also keeps the network to TCP; ``udp``: and UDP, for the
    fallback whose person allowed direct links (``landlock_network``): their names resolve by DNS."""
    p = Program()
    _start(arch, p)
    # The calls judged by their arguments first: ioctl, socket and clone are frequent, and the kernel's
    # cache of always-allowed calls cannot skip them; the refused ones are rare, so they come last.
    p.jump_if_equal(arch.nr("ioctl"), "ioctl")
    p.jump_if_equal(arch.nr("socket"), "socket")
    p.jump_if_equal(arch.nr("clone"), "clone")
    p.jump_if_equal(arch.nr("unshare"), "unshare")
    p.jump_if_equal(arch.nr("clone3"), "enosys")
    if fallback:
        # The flags' argument of each send: MSG_FASTOPEN connects and sends in one call, which
        # Landlock's connect rule does not see.
        p.jump_if_equal(arch.nr("sendto"), "send_flags_3")
        p.jump_if_equal(arch.nr("sendmmsg"), "send_flags_3")
        p.jump_if_equal(arch.nr("sendmsg"), "send_flags_2")
        p.jump_if_equal(arch.nr("setsockopt"), "setsockopt")
    for name in REFUSED:
        p.jump_if_equal(arch.nr(name), "eperm")
    p.ret(SECCOMP_RET_ALLOW)
    p.label("socket")
    p.load(_arg(0))  # the address family
    p.jump_if_equal(AF_VSOCK, "eperm")
    if fallback:
        _fallback_socket_rules(p, udp)
    p.ret(SECCOMP_RET_ALLOW)
    p.label("clone")
    p.load(_arg(0))  # the flags, on x86_64 and aarch64 alike
    p.jump_if_any_bit(CLONE_NEW_NAMESPACES, "eperm")
    p.ret(SECCOMP_RET_ALLOW)
    p.label("unshare")
    p.load(_arg(0))
    p.jump_if_any_bit(CLONE_NEW_NAMESPACES | CLONE_NEWTIME, "eperm")
    p.ret(SECCOMP_RET_ALLOW)
    p.label("ioctl")
    p.load(_arg(1))  # the request: an unsigned int, so its high 32 bits mean nothing to the kernel
    for request in (TIOCSTI, TIOCLINUX, USERFAULTFD_IOC_NEW):
        p.jump_if_equal(request, "eperm")
    p.ret(SECCOMP_RET_ALLOW)
    _end(p)
    return p.assemble()


def _fallback_socket_rules(p: Program, udp: bool = False) -> None:
    """After ``socket``'s family is loaded: inet sockets are TCP streams, other families only those
    the kernel's tree uses; then the checks of the sends' flags and of ``setsockopt``."""
    p.jump_if_equal(AF_INET, "inet")
    p.jump_if_equal(AF_INET6, "inet")
    p.jump_if_equal(AF_UNIX, "allow")
    p.jump_if_equal(AF_NETLINK, "allow", "eperm")
    p.label("inet")
    p.load(_arg(1))
    p.and_(SOCK_TYPE_MASK)  # SOCK_NONBLOCK and SOCK_CLOEXEC ride in the same argument
    if udp:
        p.jump_if_equal(SOCK_DGRAM, "dgram")
    p.jump_if_equal(SOCK_STREAM, None, "eperm")  # UDP, raw, ICMP, SCTP's seqpacket, SOCK_PACKET
    p.load(_arg(2))  # the protocol: 0 or TCP; MPTCP (262) and SCTP (132) are refused
    p.jump_if_equal(0, "allow")
    p.jump_if_equal(IPPROTO_TCP, "allow", "eperm")
    if udp:
        p.label("dgram")
        p.load(_arg(2))  # 0 or UDP; ICMP datagrams (ping sockets) are refused
        p.jump_if_equal(0, "allow")
        p.jump_if_equal(IPPROTO_UDP, "allow", "eperm")
    p.label("send_flags_3")
    p.load(_arg(3))
    p.jump_if_any_bit(MSG_FASTOPEN, "eperm", "allow")
    p.label("send_flags_2")
    p.load(_arg(2))
    p.jump_if_any_bit(MSG_FASTOPEN, "eperm", "allow")
    p.label("setsockopt")
    p.load(_arg(1))  # the level
    p.jump_if_equal(IPPROTO_TCP, None, "allow")
    p.load(_arg(2))  # the option
    p.jump_if_equal(TCP_FASTOPEN_CONNECT, "eperm")
    p.label("allow")
    p.ret(SECCOMP_RET_ALLOW)


def unix_socket_filter(arch: Arch) -> bytes:
    """No new AF_UNIX socket: for the kernel once its own sockets are bound. A pair stays possible
    when it is connection-based (stream, seqpacket: connected already, it can connect nowhere else);
    a datagram pair is refused, as its ends could ``sendto`` any datagram socket by path."""
    p = Program()
    _start(arch, p)
    p.jump_if_equal(arch.nr("socket"), "socket")
    p.jump_if_equal(arch.nr("socketpair"), "socketpair")
    p.ret(SECCOMP_RET_ALLOW)
    p.label("socket")
    p.load(_arg(0))
    p.jump_if_equal(AF_UNIX, "eperm")
    p.ret(SECCOMP_RET_ALLOW)
    p.label("socketpair")
    p.load(_arg(0))
    p.jump_if_equal(AF_UNIX, None, "allow")
    p.load(_arg(1))
    p.and_(SOCK_TYPE_MASK)  # SOCK_NONBLOCK and SOCK_CLOEXEC ride in the same argument
    p.jump_if_equal(SOCK_STREAM, "allow")
    p.jump_if_equal(SOCK_SEQPACKET, "allow", "eperm")
    p.label("allow")
    p.ret(SECCOMP_RET_ALLOW)
    _end(p)
    return p.assemble()


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(program: bytes, arch: Arch, *, all_threads: bool = False) -> None:
    """Install ``program`` on this thread (``all_threads``: on every thread of the process) and every
    process started from here on. Irreversible. Raises :class:`SeccompUnavailable` saying why."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError as exc:  # pragma: no cover - a libc that cannot be loaded
        raise SeccompUnavailable(f"libc cannot be loaded: {exc}") from exc
    # Needed without CAP_SYS_ADMIN, and what keeps a setuid program from running with the filter.
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise SeccompUnavailable(f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(err)}")
    code = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(code))
    flags = SECCOMP_FILTER_FLAG_TSYNC if all_threads else 0
    done = libc.syscall(
        ctypes.c_long(arch.nr("seccomp")),
        ctypes.c_uint(SECCOMP_SET_MODE_FILTER),
        ctypes.c_uint(flags),
        ctypes.byref(fprog),
    )
    if done < 0:
        err = ctypes.get_errno()
        raise SeccompUnavailable(f"seccomp(SECCOMP_SET_MODE_FILTER) failed: {os.strerror(err)}")
    if done > 0:  # TSYNC names the thread it could not move to the new filter
        raise SeccompUnavailable(f"seccomp could not filter thread {done} of this process too")


def filters_in_force() -> int:
    """How many seccomp filters this process runs under (``/proc/self/status``), 0 if unknown."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Seccomp_filters:"):
                    return int(line.split(":", 1)[1])
    except (OSError, ValueError):
        return 0
    return 0
