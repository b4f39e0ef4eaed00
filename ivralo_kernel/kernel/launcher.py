"""[kernel] The kernel process's entry point. Guards go in before ipykernel is imported.

Order, and why:

1. The workspace is not on ``sys.path`` (``-P``): a user file named ``socket.py`` must not shadow
   a module the guards rely on. It is added back, after the standard library, once the kernel is
   built, the way IPython adds the working directory.
2. No bytecode is written, by this process or by Python processes it starts.
3. The policy is read (the host's policy file, or the kernelspec's ``IVRALO_*`` variables).
4. Limits are applied while the process is still small and single-threaded.
5. Credentials leave ``os.environ`` (a second pass: the host and the supervisor scrubbed it before).
   The workspace ``.env`` is never read here: the host read it and passed its plain values in the
   environment, so no secret value of it is ever in this process's memory.
6. Only then is ipykernel imported and the kernel built.

Each stage is reported to the supervisor; a failure is written to ``.ivralo/python-worker.log``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
import traceback
from typing import Any

from ivralo_kernel.guards import apply_limits, scrub_environ
from ivralo_kernel.guards._hooks import FileGuard, close_the_trust_gate, install_file_guard
from ivralo_kernel.guards.fs import FsPolicy
from ivralo_kernel.guards.history import History
from ivralo_kernel.guards.landlock import LandlockResult, LandlockRules
from ivralo_kernel.guards.landlock import apply as apply_landlock
from ivralo_kernel.guards.network import install_network_guard
from ivralo_kernel.kernel.broker_client import BROKER
from ivralo_kernel.kernel.egress_judge import egress_judge
from ivralo_kernel.kernel.launch_state import STATE
from ivralo_kernel.kernel.sandbox import home_top, own_ports
from ivralo_kernel.kernel.sandbox.mounts import read_only_mounts_inside
from ivralo_kernel.kernel.sandbox.sandbox_report import (
    FALLBACK_DIRECT_REFUSAL,
    SANDBOX_DIRECT_REFUSAL,
    fallback_note,
    sandbox_layers,
    seccomp_report,
)
from ivralo_kernel.kernel.sandbox.unix_sockets import close_unix_sockets
from ivralo_kernel.kernel.stages import SupervisorPipe, write_failure
from ivralo_kernel.protocol import KernelPolicy, audience, default_memory_limit, names
from ivralo_kernel.protocol.credentials import config_home, credential_store_paths, home_config_inside
from ivralo_kernel.protocol.network.egress import PERMISSIONS_FILE, load_egress_policy
from ivralo_kernel.protocol.sandbox.closed_names import TOOL_FILES_DEFAULT
from ivralo_kernel.protocol.sandbox.fallback_reads import closed_reads, jupyter_runtime_dir, read_allow_list
from ivralo_kernel.protocol.trust import is_trusted

# Devices every kernel writes to: the null device, its terminal, and ptys. IPython runs ``!cmd`` and
# ``%pip`` through a pty (pexpect): the master is opened on /dev/ptmx, the child side in /dev/pts/.
DEVICE_FILES = ("/dev/null", "/dev/tty", "/dev/ptmx")
DEVICE_TREES = ("/dev/pts",)
_CHANNELS = ("shell", "iopub", "stdin", "control", "hb")


def _credential_stores(policy: KernelPolicy, workspace: str) -> tuple[str, ...]:
    """The stores the read guard refuses, inside the workspace too (JupyterLab started in the home
    folder), unless the workspace is one of them or inside one."""
    listed = policy.credential_stores if policy.credential_stores is not None else credential_store_paths(os.environ)
    stores = {os.path.realpath(p) for p in listed} | set(listed)
    return tuple(sorted(p for p in stores if not (workspace == p or workspace.startswith(p + os.sep))))


def _writes_scratch_only(policy: KernelPolicy) -> bool:
    """The readonly role and the hermetic surface write nowhere but the private temp folder: for the
    hermetic surface it is the scratch folder, which ``tempfile`` uses and which goes with the kernel,
    so pure-logic code that needs a file still has one, and nothing it writes outlives it."""
    return policy.role == names.ROLE_READONLY or policy.surface == names.SURFACE_HERMETIC


def _add_workspace_to_path() -> None:
    """Put the working directory on sys.path after the standard library, as IPython does."""
    if "" in sys.path:
        return
    for index, entry in enumerate(sys.path):
        if os.path.basename(entry) in {"site-packages", "dist-packages"}:
            sys.path.insert(index, "")
            return
    sys.path.append("")


def _build_app() -> Any:
    from ivralo_kernel.kernel.app import IvraloKernelApp
    from ivralo_kernel.kernel.kernel import IvraloKernel

    app = IvraloKernelApp.instance(kernel_class=IvraloKernel)
    app.initialize(sys.argv[1:])
    return app


def _private_tmp() -> str:
    """The kernel's own temp folder (made by the supervisor, or here): TMPDIR, caches, matplotlib."""
    tmp = os.environ.get(names.ENV_TMPDIR) or tempfile.mkdtemp(prefix="ivralo-kernel-")
    for var, sub in (("TMPDIR", ""), ("XDG_CACHE_HOME", "cache"), ("MPLCONFIGDIR", "matplotlib")):
        path = os.path.join(tmp, sub) if sub else tmp
        os.makedirs(path, exist_ok=True)
        os.environ[var] = path
    tempfile.tempdir = None  # forget a temp dir computed before TMPDIR changed
    return os.path.realpath(tmp)


def _tcp_floor_ports(policy: KernelPolicy, workspace: str) -> tuple[int, ...] | None:
    """Ports of the hosts allowed now (None: no TCP floor wanted). Read here, before the read guard
    closes .ivralo/; a host allowed later ("yes", "always") cannot widen a Landlock domain."""
    proxy = _fallback_proxy_port()
    # The fallback with the host's egress proxy: the kernel's Jupyter links are ipc, so the one TCP
    # port its tree needs is the proxy's; curl, pip, ctypes reach the network only through it.
    # landlock_network adds the allowed hosts' ports, for direct links (a database's driver).
    # And the kernel's own loopback links (a forked child's output, the debugger), on ports held now.
    through = (proxy, *own_ports.reserve()) if proxy is not None else ()
    if not policy.landlock_network:
        return through or None
    return tuple(dict.fromkeys((*through, *load_egress_policy(workspace, os.environ).connect_ports())))


def _fallback_refusal() -> str | None:
    """In the fallback whose TCP rule lets the tree reach the proxy only: direct links are refused with
    the reason, asking nobody (the OS would refuse them anyway)."""
    port = _fallback_proxy_port()
    if port is None or STATE.tcp_floor != (port, *own_ports.reserved()):
        return None
    return FALLBACK_DIRECT_REFUSAL.replace("{port}", str(port))


def _fallback_own_ports() -> tuple[int, ...]:
    """The fallback's loopback ports that are the kernel's own: the proxy's and its links' (held)."""
    proxy = _fallback_proxy_port()
    return (proxy, *own_ports.reserved()) if proxy is not None else ()


def _fallback_proxy_port() -> int | None:
    """Outside the sandbox, the loopback port the supervisor relays to the host's egress proxy."""
    if os.environ.get(names.ENV_SANDBOX) == names.SANDBOX_BWRAP or not os.environ.get(names.ENV_EGRESS_SOCKET):
        return None
    try:
        port = int(os.environ.get(names.ENV_RELAY_PORT) or "")
    except ValueError:
        return None
    return port if 0 < port < 65536 else None


def _tcp_floor_report(ports: tuple[int, ...] | None, result: LandlockResult) -> str:
    if ports is None:
        return "off (default; landlock_network=True turns it on)"
    if "tcp-connect" not in result.handled:
        return f"unavailable: Landlock ABI {result.abi}; the TCP floor needs ABI 4 (Linux >= 6.7)"
    if not ports:
        return "no TCP connect"
    named = [str(port) for port in ports]
    if _fallback_proxy_port() == ports[0]:  # the fallback's own ports come first (see _tcp_floor_ports)
        own = len(own_ports.reserved()) + 1
        named[0] += " (egress proxy)"
        if own > 1:
            named[own - 1] += " (the kernel's own links)"
    return "ports " + ", ".join(named)


def _apply_landlock(policy: KernelPolicy, workspace: str, tmp: str) -> tuple[str, str]:
    """The floor under the Python guards, for every process in the kernel's tree (a shell, ctypes, a
    subprocess): writes outside these trees are refused by the OS, and so is a TCP connect to a port
    no allowed host uses (BIND is never handled: the kernel binds its own ZMQ ports). Returns what
    the layer report says about the write floor and the TCP floor."""
    if not policy.landlock:
        return "off (turned off by the host's settings)", "off (the Landlock write floor is off)"
    if len(os.listdir("/proc/self/task")) != 1:  # a thread started earlier would keep write access
        return "not applied: a thread was already running", "not applied: a thread was already running"
    sandboxed = os.environ.get(names.ENV_SANDBOX) == names.SANDBOX_BWRAP
    home = _home_inside(workspace)
    workspace_grants: tuple[str, ...] = (workspace,)
    home_files: tuple[str, ...] = ()
    if home and not sandboxed:  # the sandbox keeps the home folder's top level read-only by its mounts
        # Not IPython's folder: as everywhere in the fallback, a startup file there would run in the next
        # kernel (its history is in memory then).
        own = tuple(os.path.join(workspace, name) for name in (names.HISTORY_DIR, names.WORKER_LOG))
        with contextlib.suppress(OSError):  # made now: once Landlock is on, nothing new appears at the top
            os.makedirs(own[0], exist_ok=True)
        workspace_grants, home_files = home_top.write_grants(workspace, home, own)
    # The GPUs the host passes through (protocol/sandbox/devices.py): their nodes, and /dev/dri's tree.
    device_trees = (*DEVICE_TREES, *(p for p in policy.devices if os.path.isdir(p)))
    device_files = (*DEVICE_FILES, *(p for p in policy.devices if not os.path.isdir(p)))
    write_trees = (tmp, *device_trees) if _writes_scratch_only(policy) else (*workspace_grants, tmp, *device_trees)
    ports = _tcp_floor_ports(policy, workspace)
    connection_file = _connection_file()
    write_files: tuple[str, ...] = (*device_files, connection_file) if connection_file else device_files
    if not _writes_scratch_only(policy):
        write_files += home_files
    ipc = _ipc_socket_folder()
    exchange = _exchange_folder()
    reads = None if sandboxed else _fallback_read_trees(policy, workspace, tmp, exchange)
    rules = LandlockRules(
        read_trees=reads,
        write_trees=write_trees,
        write_files=write_files,
        socket_trees=(ipc,) if ipc else (),
        exchange_trees=(exchange,) if exchange else (),
        connect_ports=ports,
        # Outside a sandbox these are what keeps the tree from signalling the person's processes and
        # from reaching abstract sockets (X11, D-Bus); inside one they cost nothing.
        scope_signals=True,
        scope_abstract_sockets=True,
    )
    result = apply_landlock(rules)
    tcp_report = _tcp_floor_report(ports, result)
    if not result.applied:
        STATE.notes.append(result.reason)
        return f"unavailable: {result.reason}", tcp_report
    if "tcp-connect" in result.handled:
        STATE.tcp_floor = ports
    elif ports is not None:
        STATE.notes.append(f"TCP connect floor {tcp_report}: subprocesses may connect to any port")
    return f"ABI {result.abi}: {', '.join(result.handled)}", tcp_report


def _fallback_read_trees(
    policy: KernelPolicy, workspace: str, tmp: str, exchange: str | None
) -> tuple[str, ...] | None:
    """Without a sandbox, what the kernel's tree may read (protocol/sandbox/fallback_reads.py); None when
    the host turned the read floor off. Its own connection file, temp and exchange folders and
    IPython's folder are granted by themselves; other kernels' files beside them are not."""
    if policy.fallback_reads is None:
        return None
    connection_file = _connection_file_arg()
    runtime = [jupyter_runtime_dir(os.environ), os.path.dirname(connection_file) if connection_file else ""]
    closed = closed_reads(os.environ, _credential_stores(policy, workspace), runtime)
    closed = [p for p in closed if not (workspace == p or workspace.startswith(p + os.sep))]
    # The workspace is granted whole: a cell reads back what it wrote at its top level (docker-stacks'
    # workspace is the home folder). Landlock grants a folder with all it holds, so what is closed
    # inside it stays readable there; the OS sandbox closes it.
    inside = [p for p in closed if p.startswith(workspace.rstrip(os.sep) + os.sep)]
    closed = [p for p in closed if p not in inside]
    ipython_dir = os.environ.get("IPYTHONDIR") or os.path.expanduser("~/.ipython")
    trees, _split = read_allow_list(
        workspace=workspace,
        home=os.path.expanduser("~"),
        # The config home's allow list of hosts is no secret, and a kernel without a host judges by it.
        own=(tmp, connection_file or "", exchange or "", ipython_dir, str(config_home(os.environ) / PERMISSIONS_FILE)),
        extra=policy.fallback_reads,
        closed=closed,
    )
    if inside:
        STATE.notes.append(
            "the workspace holds Jupyter's runtime folder or a credential store, and the read floor grants the "
            "workspace whole, so they stay readable from the kernel's processes (other kernels' connection files "
            "give no way in: the TCP rule and Landlock's socket scope close their ports); work in a subfolder, or "
            "give the container the settings for the full sandbox (ivralo-kernel doctor names them)"
        )
    return trees


def _exchange_folder() -> str | None:
    """The folder the host creates the namespace API's segments in: the kernel writes into the ones
    it is given and unlinks them once mapped (see ``kernel.dataplane``); it makes none there."""
    path = os.environ.get(names.ENV_EXCHANGE_DIR)
    return os.path.realpath(path) if path and os.path.isdir(path) else None


def _connection_file_arg() -> str | None:
    """The ``-f`` / ``--f=`` argument, absolute."""
    argv = sys.argv[1:]
    path = next((a.split("=", 1)[1] for a in argv if a.startswith(("--f=", "-f="))), None)
    if path is None and "-f" in argv[:-1]:
        path = argv[argv.index("-f") + 1]
    return os.path.abspath(path) if path else None


def _ipc_socket_folder() -> str | None:
    """With the ``ipc`` transport, the folder ipykernel creates its socket files in (beside the
    connection file unless the host chose a folder of its own): only sockets may be made there."""
    path = _connection_file_arg()
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            given = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(given, dict) or given.get("transport") != "ipc" or not given.get("ip"):
        return None
    if str(given["ip"]).startswith("@"):
        return None  # abstract sockets (the fallback's): no folder, no file
    return os.path.dirname(os.path.abspath(str(given["ip"])))


def _connection_file() -> str | None:
    """The connection file ipykernel will write, made writable for it under the floor.

    ipykernel rewrites the file when its ports are 0 (it picks them), and writes it when there is none
    yet. It lives in Jupyter's runtime folder, outside the workspace, so the Landlock floor names the
    file itself (never the folder, which holds other kernels' files), and only when ipykernel will
    write it: otherwise a shell in the kernel could rewrite it. A missing one is created empty first,
    so that there is a file to name: ipykernel reads ``{}`` as "nothing given" and fills it in.
    """
    path = _connection_file_arg()
    if not path:
        return None
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                given = json.load(f)
        except (OSError, ValueError):
            return None  # ipykernel will say what is wrong with it
        if isinstance(given, dict) and all(given.get(f"{channel}_port") for channel in _CHANNELS):
            return None  # every port given: ipykernel leaves the file as it is
    else:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            return None  # ipykernel will say what is wrong with the folder
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("{}")
    # jupyter_core's secure_write deletes the file and creates it 0600; the floor keeps the folder
    # from changing, so the file stays, and a mode other than 0600 would make it refuse to write.
    with contextlib.suppress(OSError):
        os.chmod(path, 0o600)
    return path


def _ensure_ipython_profile() -> None:
    """IPython creates its profile folder on first use; do it before the write floor goes down."""
    from IPython.core.profiledir import ProfileDir
    from IPython.paths import get_ipython_dir

    ProfileDir.create_profile_dir_by_name(get_ipython_dir(), "default")


def _home_inside(workspace: str) -> str:
    home = os.path.realpath(os.path.expanduser("~"))
    return home if home == workspace or home.startswith(workspace.rstrip(os.sep) + os.sep) else ""


def _closed_tools(workspace: str) -> tuple[str, ...]:
    """The tool files the write guard refuses with a sentence. In the sandbox, every read-only mount
    inside the workspace, read from this process's mount table: the host's own list (its tool_files
    setting) with the placeholders of missing ones, a project's .venv; and a default name that is a
    link (the mount closes its target, not the link). Without the sandbox, the defaults."""
    defaults = [os.path.join(workspace, name) for name in TOOL_FILES_DEFAULT]
    if os.environ.get(names.ENV_SANDBOX) == names.SANDBOX_BWRAP:
        found = read_only_mounts_inside(workspace) + [p for p in defaults if os.path.islink(p)]
    else:
        found = defaults
    state = os.path.join(workspace, names.STATE_DIR)
    return tuple(p for p in dict.fromkeys(found) if not (p == state or p.startswith(state + os.sep)))


def _install_file_guards(policy: KernelPolicy, workspace: str) -> tuple[FileGuard, bool]:
    tmp = _private_tmp()
    _ensure_ipython_profile()
    # Read before Landlock: in the fallback its read floor closes the home folder's listing and the
    # config home (the trust store) to this process too.
    closed_writes = home_config_inside(workspace, os.environ)
    closed_tools = _closed_tools(workspace)
    trusted = policy.trusted if policy.trusted is not None else is_trusted(workspace, os.environ)
    STATE.layers["landlock"], STATE.layers["tcp_connect_floor"] = _apply_landlock(policy, workspace, tmp)
    connection_file = _connection_file_arg() or ""
    ipython_dir = os.environ.get("IPYTHONDIR") or os.path.expanduser("~/.ipython")
    fs_policy = FsPolicy(
        workspace=workspace,
        readonly=policy.role == names.ROLE_READONLY,
        hermetic=policy.surface == names.SURFACE_HERMETIC,
        writable_extra=(tmp, *DEVICE_FILES, *DEVICE_TREES, *policy.devices, *filter(None, [_exchange_folder()])),
        config_home_is_workspace=os.path.realpath(config_home(os.environ)) == workspace,
        closed_reads=_credential_stores(policy, workspace),
        closed_writes=closed_writes,
        closed_tools=closed_tools,
        home_inside=_home_inside(workspace),
        home_kept_open=(os.path.realpath(ipython_dir),),
        # While the kernel starts, IPython may create its profile folder and ipykernel its runtime files.
        allow_during_startup=tuple(
            os.path.realpath(d) for d in (ipython_dir, os.path.dirname(os.path.abspath(connection_file))) if d
        ),
    )
    history = History(os.path.join(workspace, names.HISTORY_DIR), policy.history_cap_bytes, policy.history_cap_count)
    return install_file_guard(fs_policy, history), trusted


def main() -> None:
    reporter = SupervisorPipe(os.environ)
    STATE.started_at = float(os.environ.pop(names.ENV_LAUNCHED_AT, "") or time.time())
    BROKER.comm_id = os.environ.pop(names.ENV_BROKER_COMM, "") or None  # a host started us and will answer
    BROKER.take_socket(os.environ.pop(names.ENV_BROKER_FD, ""))  # on this socket
    sys.dont_write_bytecode = True  # step 2
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    reporter.reached_stage(names.STAGE_INTERPRETER_UP)
    workspace = os.getcwd()
    try:
        policy = KernelPolicy.from_env(os.environ, workspace)  # step 3
        audience.set_audience(policy.audience)  # the guards' refusals speak to their reader
        workspace = os.path.realpath(policy.workspace)
        os.chdir(workspace)
        os.environ[names.ENV_WORKSPACE] = workspace
        limits = apply_limits(policy.memory_limit_bytes or default_memory_limit(), policy.rlimit_nofile)  # 4
        reporter.reached_stage(names.STAGE_LIMITS_APPLIED)

        removed, problems = scrub_environ(workspace)  # step 5
        STATE.workspace, STATE.role, STATE.policy, STATE.pipe = workspace, policy.role, policy, reporter
        STATE.scrubbed = sorted(set(removed))
        STATE.notes += problems
        STATE.notes += [line for line in os.environ.pop(names.ENV_HOST_NOTES, "").splitlines() if line]
        STATE.layers = {}
        file_guard, trusted = _install_file_guards(policy, workspace)
        STATE.files = file_guard
        supervisor_layers = dict(
            item.split("=", 1) for item in os.environ.pop(names.ENV_SUPERVISOR_LAYERS, "").split(",") if "=" in item
        )
        STATE.layers |= {
            "supervisor": bool(os.environ.get(names.ENV_SUPERVISOR_PID)),
            "subreaper": supervisor_layers.get("subreaper") == "1",
            "parent_death_signal": supervisor_layers.get("parent_death_signal") == "1",
            # Set by the supervisor for the sandbox's own namespaces (supervisor/namespace_limits.py).
            "namespace_limits": (
                f"{supervisor_layers['namespace_limits']} set (inotify instances and watches, System V IPC)"
                if supervisor_layers.get("namespace_limits", "0") != "0"
                else "none (no namespace of the kernel's own: the host's observer counts inotify instances)"
            ),
            "seccomp": seccomp_report(supervisor_layers.get("seccomp", ""), policy.landlock_network),
            "write_guard": "audit hook",
            "read_guard": "audit hook",
            "trust_gate": "open (trusted folder)" if trusted else "closed (folder not trusted)",
            "env_scrub": True,
            "memory_cap": "RLIMIT_DATA",
            "memory_limit_bytes": limits.memory_limit_bytes,
            "rlimit_nofile": limits.rlimit_nofile,
            "core_dumps": False,
            "dumpable": limits.dumpable,
            "bytecode_written": False,
            "surface": policy.surface,
            "code_gate": "on (checked on each cell before it runs)" if policy.code_gate else "off",
        }
        reporter.reached_stage(names.STAGE_GUARDS_INSTALLED)

        tree_root = os.getppid() if os.environ.get(names.ENV_SUPERVISOR_PID) else os.getpid()
        sandboxed = os.environ.get(names.ENV_SANDBOX) == names.SANDBOX_BWRAP
        STATE.network = install_network_guard(
            egress_judge(workspace),
            tcp_floor=STATE.tcp_floor,
            tree_root=tree_root,
            direct_refusal=SANDBOX_DIRECT_REFUSAL if sandboxed else _fallback_refusal(),
            own_ports=() if sandboxed else _fallback_own_ports(),
        )
        proxy = None if sandboxed else _fallback_proxy_port()
        STATE.layers |= sandbox_layers(
            os.environ.get(names.ENV_SANDBOX, ""), STATE.layers.get("landlock", ""), proxy, STATE.tcp_floor is not None
        )
        if not sandboxed:
            mode, landlock = os.environ.get(names.ENV_SANDBOX, ""), STATE.layers.get("landlock", "")
            STATE.notes.append(fallback_note(mode, proxy, STATE.tcp_floor is not None, landlock))
        if STATE.tcp_floor is not None:
            own_ports.install()  # the IOPub pipe's port, before the app builds it
        app = _build_app()  # step 6
        # Its Jupyter sockets are bound: from here on no new unix socket, for it and its tree.
        unix_sockets = STATE.layers["unix_sockets"] = close_unix_sockets(app)
        if not unix_sockets.startswith("closed"):
            STATE.notes.append(f"unix sockets of this machine are reachable from the kernel: {unix_sockets}")
        file_guard.starting = False  # from here on, the kernel's own folders are closed too
        STATE.network.starting = False
        if trusted:
            _add_workspace_to_path()  # step 1, second half
        else:
            close_the_trust_gate(workspace)
        STATE.bootstrap_ms = round((time.time() - STATE.started_at) * 1000, 1)
        reporter.reached_stage(names.STAGE_KERNEL_BUILT)
    except BaseException as exc:  # noqa: BLE001 - whatever stops the start is written to the log first
        # On stderr in full: the supervisor keeps its tail in the worker log (the write guard, once
        # installed, closes .ivralo/ to this process too). Without a supervisor, the log is ours.
        traceback.print_exception(exc, file=sys.stderr)
        where = "the supervisor records it in " + names.WORKER_LOG
        if not reporter.connected:
            try:
                where = f"details in {write_failure(workspace, reporter.reached, exc)}"
            except OSError as log_error:
                where = f"the log could not be written: {log_error}"
        print(f"ivralo kernel failed to start: {exc!r} ({where})", file=sys.stderr, flush=True)
        # Not SystemExit: ipykernel may have started threads already (IOPub, heartbeat) that would
        # keep a failed kernel alive, and the host waiting for it, until its bootstrap budget ends.
        os._exit(1)
    app.start()
