"""[host] ``EgressGate``: one kernel's egress proxy, and the one call that decides each connection.

The proxy (host/sandbox/egress_proxy.py) asks ``decide`` for every ``host:port`` a cell's code wants to
reach: the broker's policy and the same people as the guard's questions decide, the execution's
deadline pausing while a person answers; then the clients' side of the kernel's relay and every
other kernel's channels on this machine are refused, whatever was allowed (``closed_peer``). The
gate serves one provisioner at a time: a provisioner that adopts a warm spare takes its gate over
with ``serve`` (its own ports, its own people, from then on).
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import psutil

from ivralo_kernel.host.sandbox.egress_notes import NOTE_WAIT_S, EgressNotes
from ivralo_kernel.host.sandbox.egress_proxy import EgressProxy, Verdict
from ivralo_kernel.host.settings.workspace_files import Stamp, stamp
from ivralo_kernel.protocol import names

if TYPE_CHECKING:
    from ivralo_kernel.host.broker.responder import BrokerResponder
    from ivralo_kernel.host.watch.watchdog import Watchdog

CHANNEL_NAMES = ("shell", "iopub", "stdin", "control", "hb")


class GatedKernel(Protocol):
    """What the gate reads of the provisioner it serves (``IvraloProvisioner``)."""

    @property
    def broker(self) -> BrokerResponder | None: ...

    @property
    def watchdog(self) -> Watchdog | None: ...

    @property
    def connection_info(self) -> Mapping[str, Any]: ...  # the clients' (jupyter_client's KernelConnectionInfo)

    def clients_connection_file(self) -> str: ...

    def ask_person(self, execution: str, prompt: str) -> str | None: ...


class EgressGate:
    def __init__(self, socket_path: str, kernel: GatedKernel) -> None:
        self._kernel = kernel
        self._folders: dict[str, tuple[Stamp | bool, list[str]]] = {}  # folder -> (its stamp, its connection files)
        self._files: dict[str, tuple[Stamp | bool, set[int]]] = {}  # connection file -> (its stamp, its ports)
        self._files_lock = threading.Lock()  # the proxy serves each connection on a thread of its own
        self.notes: EgressNotes | None = None  # the cell's own line about each decision (set with the watchdog)
        self.proxy = EgressProxy(socket_path, self.decide, self.closed_peer)
        self.proxy.start()

    def serve(self, kernel: GatedKernel) -> None:
        """Decide for ``kernel`` from now on (a provisioner that adopted this gate's spare kernel)."""
        self._kernel = kernel

    def close(self) -> None:
        self.proxy.close()

    def decide(self, host: str, port: int) -> Verdict:
        """(the egress proxy's thread) The same policy and the same people as the guard's questions."""
        kernel = self._kernel
        broker, watchdog = kernel.broker, kernel.watchdog
        if broker is None:
            return Verdict(False, "the kernel's host is shutting down")
        execution = watchdog.current_execution() if watchdog is not None else None
        if execution is None and watchdog is not None:
            # The cell's first request can be here before the watchdog has read its "busy": the kernel
            # itself knows which execution is running.
            execution = _ask_running_execution(watchdog)

        def pause(on: bool) -> None:
            if watchdog is not None and execution is not None:
                (watchdog.pause if on else watchdog.resume)(execution)

        allowed, reason = broker.egress.decide(host, port, execution, kernel.ask_person, pause)
        if allowed and (closed := self._closed_target(host, port)) is not None:
            allowed, reason = False, closed  # the cell's line says so; the proxy checks the address it reaches too
        if watchdog is None or execution is None:
            return Verdict(allowed, reason)
        notes = self.notes
        if notes is None:
            return Verdict(allowed, reason)
        return Verdict(allowed, reason, notes.note(execution, host, port, allowed, reason))

    def _closed_target(self, host: str, port: int) -> str | None:
        """An allowed ``host:port`` that resolves to the clients' side of the relay (looked up only
        after a yes, as the proxy would)."""
        if port not in self._client_ports() | self._runtime_ports():
            return None
        try:
            addresses = {info[4] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
        except OSError:
            return None  # the proxy's own connect fails the same way, and says why
        return next(filter(None, map(self.closed_peer, addresses)), None)

    def _client_ports(self) -> set[int]:
        info = self._kernel.connection_info
        if info.get("transport", "tcp") != "tcp":
            return set()
        return {port for c in CHANNEL_NAMES if isinstance(port := info.get(f"{c}_port"), int)}

    def closed_peer(self, peer: tuple[Any, ...]) -> str | None:
        """(the egress proxy's thread) The clients' side of this kernel's relay is never reachable
        through the proxy, whatever was allowed: with it, code in the kernel could take a client's
        place on stdin (its identity is in every request) and answer the host's questions. Nor are
        other kernels' channels (the Jupyter runtime folder's connection files): outside the sandbox
        a kernel can read their keys, and run code in them through the proxy after a yes."""
        if peer[1] in self._client_ports() and on_this_machine(str(peer[0])):
            return "it is one of this kernel's own Jupyter channels, for its clients only"
        if peer[1] in self._runtime_ports() and on_this_machine(str(peer[0])):
            return "it is a Jupyter kernel's channel on this machine, for that kernel's clients only"
        return None

    def _runtime_ports(self) -> set[int]:
        """The TCP ports in the connection files of Jupyter's runtime folder (every kernel's here).
        A folder is listed again, and a file read again, only when its stamp moved (asked twice for
        every request the proxy serves)."""
        folders = {_runtime_dir(), os.path.dirname(self._kernel.clients_connection_file())}
        with self._files_lock:
            return self._ports_of(folders)

    def _ports_of(self, folders: set[str]) -> set[int]:
        ports: set[int] = set()
        for path in (p for folder in folders if folder for p in self._connection_files(folder)):
            seen = stamp(path)
            cached = self._files.get(path)
            if seen is not False and cached is not None and cached[0] == seen:
                ports |= cached[1]
                continue
            found = _ports_in(path)
            ports |= found
            if seen is not False:
                self._files[path] = (seen, found)
        return ports

    def _connection_files(self, folder: str) -> list[str]:
        seen = stamp(folder)  # a name added, removed or renamed moves the folder's mtime
        cached = self._folders.get(folder)
        if seen is not False and cached is not None and cached[0] == seen:
            return cached[1]
        try:  # glob's pattern matching, for a prefix and a suffix, took 150 us in a busy /tmp
            with os.scandir(folder) as entries:
                found = [e.path for e in entries if e.name.startswith("kernel-") and e.name.endswith(".json")]
        except OSError:
            found = []
        if seen is not False:
            self._folders[folder] = (seen, found)
            kept = set(found)
            self._files = {
                path: v for path, v in self._files.items() if os.path.dirname(path) != folder or path in kept
            }
        return found


# What jupyter_core's runtime folder follows (it resolves the home folder each time: 70 us, twice a
# request); the folder is worked out again when one of them changes.
_RUNTIME_DIR_VARIABLES = ("JUPYTER_RUNTIME_DIR", "JUPYTER_DATA_DIR", "JUPYTER_PLATFORM_DIRS", "XDG_DATA_HOME", "HOME")
_runtime_dirs: dict[tuple[str | None, ...], str] = {}


def _runtime_dir() -> str:
    key = tuple(os.environ.get(name) for name in _RUNTIME_DIR_VARIABLES)
    folder = _runtime_dirs.get(key)
    if folder is None:
        from jupyter_core.paths import jupyter_runtime_dir

        folder = _runtime_dirs[key] = jupyter_runtime_dir()
    return folder


def _ports_in(path: str) -> set[int]:
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except (OSError, ValueError):
        return set()
    if isinstance(info, dict) and info.get("transport", "tcp") == "tcp":
        return {port for c in CHANNEL_NAMES if isinstance(port := info.get(f"{c}_port"), int)}
    return set()


def on_this_machine(address: str) -> bool:
    """A loopback, unspecified or local interface's address (the relay may bind any of them)."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback or ip.is_unspecified:
        return True
    local = {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    return str(ip) in local


def _ask_running_execution(watchdog: Watchdog) -> str | None:
    """(any thread but the watchdog's) The execution the kernel is running, asked over control."""
    answered = threading.Event()
    box: list[str | None] = []

    def on_reply(reply: dict[str, Any]) -> None:
        executing = (reply.get("content") or {}).get("executing")
        box.append(executing if isinstance(executing, str) else None)
        answered.set()

    watchdog.send_control(names.MSG_STATUS_REQUEST, {}, on_reply)
    answered.wait(NOTE_WAIT_S)
    return box[0] if box else None
