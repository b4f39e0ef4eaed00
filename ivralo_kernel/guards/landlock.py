"""[guards] Landlock: the OS refuses writes outside the allowed trees (changes process state, irreversibly).

Landlock (Linux >= 5.13) is the kernel-enforced half of the write guard: the audit hook gives a
friendly error for Python-level writes, Landlock stops every write, from any code (ctypes, C
extensions, ``sh``, ``curl``), in this process and in every process it starts later.

* Write-type filesystem rights are handled; reads (``READ_FILE``, ``READ_DIR``) only when
  ``read_trees`` is given (the fallback, where no mount hides anything: an allow list of what a
  kernel reads, see ``protocol/sandbox/fallback_reads.py``). Executing is never handled.
  ``IOCTL_DEV`` (ABI 5) is deliberately not handled: once handled, every device opened afterwards
  refuses non-generic ioctls unless a rule grants them, which breaks ``/dev/tty`` and ``/dev/pts``
  terminal control (``stty``, ``getpass``, pagers) and GPU devices, and it is not a write anyway.
* Metadata changes (chmod, chown, utime) are not covered by Landlock at any ABI.
* TCP connect/bind port allow-lists need ABI >= 4; UDP (and so DNS) is never covered.
* **Threads:** ``landlock_restrict_self`` restricts only the calling thread and the processes and
  threads it creates afterwards. A thread that already runs keeps full write access, so call
  :func:`apply` before any other thread starts (ipykernel starts several): in a small launcher that
  then ``exec``s the kernel. The restriction survives ``exec`` and cannot be lifted; applying again
  only adds another layer on top.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import stat
import sys
from dataclasses import dataclass

# Syscall numbers from the unified table (>= 424), the same on x86_64 and aarch64.
_SYS_CREATE_RULESET = 444
_SYS_ADD_RULE = 445
_SYS_RESTRICT_SELF = 446

PR_SET_NO_NEW_PRIVS = 38

_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_RULE_NET_PORT = 2

# Filesystem access rights, with the ABI that introduced them.
_FS_EXECUTE = 1 << 0  # 1 (never handled here: listed for the file-rights mask)
_FS_WRITE_FILE = 1 << 1  # 1
_FS_READ_FILE = 1 << 2  # 1 (handled with read_trees)
_FS_READ_DIR = 1 << 3  # 1 (handled with read_trees)
_FS_REMOVE_DIR = 1 << 4  # 1
_FS_REMOVE_FILE = 1 << 5  # 1
_FS_MAKE_CHAR = 1 << 6  # 1
_FS_MAKE_DIR = 1 << 7  # 1
_FS_MAKE_REG = 1 << 8  # 1
_FS_MAKE_SOCK = 1 << 9  # 1
_FS_MAKE_FIFO = 1 << 10  # 1
_FS_MAKE_BLOCK = 1 << 11  # 1
_FS_MAKE_SYM = 1 << 12  # 1
_FS_REFER = 1 << 13  # 2: rename/link into another directory
_FS_TRUNCATE = 1 << 14  # 3
_FS_IOCTL_DEV = 1 << 15  # 5 (never handled here, see the module docstring)

_NET_BIND_TCP = 1 << 0  # 4
_NET_CONNECT_TCP = 1 << 1  # 4
_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # 6
_SCOPE_SIGNAL = 1 << 1  # 6

_WRITE_RIGHTS_BY_ABI: tuple[tuple[int, int], ...] = (
    (
        1,
        _FS_WRITE_FILE
        | _FS_REMOVE_DIR
        | _FS_REMOVE_FILE
        | _FS_MAKE_CHAR
        | _FS_MAKE_DIR
        | _FS_MAKE_REG
        | _FS_MAKE_SOCK
        | _FS_MAKE_FIFO
        | _FS_MAKE_BLOCK
        | _FS_MAKE_SYM,
    ),
    (2, _FS_REFER),
    (3, _FS_TRUNCATE),
)
# The kernel rejects (EINVAL) a rule on a non-directory that grants directory-only rights.
_FILE_ONLY_RIGHTS = _FS_EXECUTE | _FS_WRITE_FILE | _FS_READ_FILE | _FS_TRUNCATE | _FS_IOCTL_DEV

NOT_AVAILABLE = (
    "Landlock is not available on this kernel (ABI 0): writes outside the workspace are refused only "
    "by the Python-level guard"
)


@dataclass(frozen=True)
class LandlockRules:
    """What stays allowed once Landlock is applied. Everything else of each handled kind is refused.

    ``connect_ports`` / ``bind_ports``: ``None`` leaves that TCP operation unrestricted; a tuple
    (possibly empty) allows only those ports. ``scope_signals`` stops the sandboxed processes from
    signalling processes outside their domain (ABI >= 6); it does not stop others signalling them.
    """

    write_trees: tuple[str, ...] = ()
    write_files: tuple[str, ...] = ()
    # Folders where only unix sockets may be created (the ipc transport's, in Jupyter's runtime
    # folder beside other kernels' connection files, which must stay unwritable).
    socket_trees: tuple[str, ...] = ()
    # Folders where files others made may be written to and removed, but none made (the namespace
    # API's exchange folder: the host creates and sizes each segment there).
    exchange_trees: tuple[str, ...] = ()
    # None: reads stay free. A tuple: only these trees (or files) can be read or listed.
    read_trees: tuple[str, ...] | None = None
    connect_ports: tuple[int, ...] | None = None
    bind_ports: tuple[int, ...] | None = None
    scope_signals: bool = False
    # Abstract unix sockets made outside the domain (X11, D-Bus, tmux-like servers) cannot be reached.
    scope_abstract_sockets: bool = False


@dataclass(frozen=True)
class LandlockResult:
    """``handled`` names what is now restricted (``"fs-write"``, ``"tcp-connect"``, ``"tcp-bind"``,
    ``"signal-scope"``). ``reason`` says why nothing, or not everything asked for, was applied.
    ``skipped`` lists rule paths that did not exist (they grant nothing)."""

    abi: int
    applied: bool
    handled: tuple[str, ...] = ()
    reason: str = ""
    skipped: tuple[str, ...] = ()


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),  # ABI 4
        ("scoped", ctypes.c_uint64),  # ABI 6
    )


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is packed: 12 bytes, not 16
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


class _NetPortAttr(ctypes.Structure):
    _fields_ = (("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64))


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.prctl.restype = ctypes.c_int
    return libc


def _syscall(number: int, *args: object) -> int:
    result: int = _libc().syscall(ctypes.c_long(number), *args)
    return result


def _check(result: int, call: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{call} failed: {os.strerror(code)}")
    return result


def abi() -> int:
    """The running kernel's Landlock ABI version; 0 when unsupported or disabled. Never raises."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        version = _syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except (OSError, AttributeError, ctypes.ArgumentError):
        return 0
    # ENOSYS (built without it) and EOPNOTSUPP (disabled at boot) both come back as -1.
    return version if version > 0 else 0


def _ruleset_size(version: int) -> int:
    # Pass only the fields this ABI knows: the kernel also accepts a longer struct with a zero tail,
    # but that was never tested on an old kernel, and the exact size costs nothing.
    if version >= 6:
        return ctypes.sizeof(_RulesetAttr)
    if version >= 4:
        return 16
    return 8


def _check_ports(ports: tuple[int, ...] | None, what: str) -> None:
    for port in ports or ():
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"{what} must be TCP port numbers 0-65535, got {port!r}")


def _add_rule(ruleset_fd: int, rule_type: int, rule: ctypes.Structure, call: str) -> None:
    args = (ctypes.c_int(ruleset_fd), ctypes.c_int(rule_type), ctypes.byref(rule), ctypes.c_uint32(0))
    _check(_syscall(_SYS_ADD_RULE, *args), call)


def _add_path_rule(ruleset_fd: int, path: str, rights: int, *, tree: bool) -> bool:
    """Grant ``rights`` beneath ``path``. Returns False when the path does not exist."""
    try:
        path_fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        mode = os.fstat(path_fd).st_mode
        if tree and not stat.S_ISDIR(mode):
            raise NotADirectoryError(errno.ENOTDIR, "a Landlock write tree must be a directory", path)
        if not stat.S_ISDIR(mode):
            rights &= _FILE_ONLY_RIGHTS
        rule = _PathBeneathAttr(allowed_access=rights, parent_fd=path_fd)
        _add_rule(ruleset_fd, _RULE_PATH_BENEATH, rule, f"landlock_add_rule({path!r})")
    finally:
        os.close(path_fd)
    return True


def _add_port_rule(ruleset_fd: int, port: int, right: int) -> None:
    rule = _NetPortAttr(allowed_access=right, port=port)
    _add_rule(ruleset_fd, _RULE_NET_PORT, rule, f"landlock_add_rule(port {port})")


def apply(rules: LandlockRules) -> LandlockResult:
    """Restrict the calling thread and every process it starts afterwards, for good.

    Call before any other thread exists (see the module docstring). Without Landlock (ABI 0) this
    changes nothing and returns ``applied=False``. Parts the running ABI cannot enforce (TCP below
    ABI 4, signal scoping below ABI 6) are left out and named in ``reason``; the rest is applied.
    Raises ``OSError`` naming the failing call, ``NotADirectoryError`` for a write tree that is a
    file, ``ValueError`` for a bad port; in all these cases the process is left unrestricted.
    """
    _check_ports(rules.connect_ports, "connect_ports")
    _check_ports(rules.bind_ports, "bind_ports")
    version = abi()
    if version < 1:
        return LandlockResult(abi=0, applied=False, reason=NOT_AVAILABLE)

    write = 0
    for since, bits in _WRITE_RIGHTS_BY_ABI:
        if version >= since:
            write |= bits
    handled = ["fs-write"]
    notes: list[str] = []
    read = 0
    if rules.read_trees is not None:
        read = _FS_READ_FILE | _FS_READ_DIR
        handled.append("fs-read")

    net = 0
    wants_tcp = rules.connect_ports is not None or rules.bind_ports is not None
    if wants_tcp and version < 4:
        notes.append(f"TCP port rules need Landlock ABI >= 4 (this kernel has ABI {version}); TCP is not restricted")
    elif wants_tcp:
        if rules.connect_ports is not None:
            net |= _NET_CONNECT_TCP
            handled.append("tcp-connect")
        if rules.bind_ports is not None:
            net |= _NET_BIND_TCP
            handled.append("tcp-bind")

    scoped = 0
    if (rules.scope_signals or rules.scope_abstract_sockets) and version < 6:
        notes.append(f"signal and abstract-socket scoping need Landlock ABI >= 6 (this kernel has ABI {version})")
    else:
        if rules.scope_signals:
            scoped |= _SCOPE_SIGNAL
            handled.append("signal-scope")
        if rules.scope_abstract_sockets:
            scoped |= _SCOPE_ABSTRACT_UNIX_SOCKET
            handled.append("abstract-socket-scope")

    attr = _RulesetAttr(handled_access_fs=write | read, handled_access_net=net, scoped=scoped)
    ruleset_fd = _check(
        _syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(_ruleset_size(version)), ctypes.c_uint32(0)),
        "landlock_create_ruleset",
    )
    skipped: list[str] = []
    try:
        for path in rules.write_trees:
            if not _add_path_rule(ruleset_fd, path, write, tree=True):
                skipped.append(path)
        for path in rules.write_files:
            if not _add_path_rule(ruleset_fd, path, write, tree=False):
                skipped.append(path)
        for path in rules.socket_trees:
            if not _add_path_rule(ruleset_fd, path, _FS_MAKE_SOCK, tree=True):
                skipped.append(path)
        for path in rules.exchange_trees:
            if not _add_path_rule(ruleset_fd, path, _FS_WRITE_FILE | _FS_REMOVE_FILE | read, tree=True):
                skipped.append(path)
        for path in rules.read_trees or ():
            if not _add_path_rule(ruleset_fd, path, read, tree=False):
                skipped.append(path)
        if net & _NET_CONNECT_TCP:
            for port in rules.connect_ports or ():
                _add_port_rule(ruleset_fd, port, _NET_CONNECT_TCP)
        if net & _NET_BIND_TCP:
            for port in rules.bind_ports or ():
                _add_port_rule(ruleset_fd, port, _NET_BIND_TCP)
        # Process state changes only from here on, so a bad rule above leaves the process as it was.
        # Without CAP_SYS_ADMIN restrict_self fails with EPERM unless no_new_privs is set; it also
        # stops a setuid binary from regaining what the sandbox takes away.
        _check(_libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
        _check(_syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset_fd), ctypes.c_uint32(0)), "landlock_restrict_self")
    finally:
        os.close(ruleset_fd)
    if skipped:
        notes.append("skipped paths that do not exist: " + ", ".join(skipped))
    return LandlockResult(
        abi=version, applied=True, handled=tuple(handled), reason="; ".join(notes), skipped=tuple(skipped)
    )
