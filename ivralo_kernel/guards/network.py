"""[guards] The network guard: every host the code tries to reach is judged before the name goes
anywhere, not even to DNS (changes process state through the audit hook it installs).

Lookups (``socket.getaddrinfo``, ``gethostbyname*``) are judged by name; IP literals pass the
lookup and are judged at ``connect``/``connect_ex``/``sendto``/``sendmsg``, where an address that came from an
allowed name is allowed. The audit hook sees ``_socket`` and ``importlib.reload(socket)`` too.
A refusal is a ``socket.gaierror`` carrying the reason, so urllib, requests, httpx and asyncio fail
the way they already know how to. The judge (who asks the host) is injected by the kernel room.
Not covered: ctypes, subprocesses (the Landlock TCP floor is the answer there), UDP beyond sendto.

The TCP floor (Landlock, see ``landlock.py``) is fixed when the kernel starts and cannot widen, while
this guard may allow a host later (a "yes", until the kernel restarts). A TCP connect the guard allows to a port outside
the floor would fail with a bare EACCES from the OS; it is refused here first, with a sentence that
says why and what to change. TCP ``sendto`` (TCP Fast Open) and MPTCP sockets get the same check:
Landlock itself misses them, so for Python code this guard is the only place that keeps the limit.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from ivralo_kernel.guards.local_links import LocalLinks
from ivralo_kernel.protocol import audience
from ivralo_kernel.protocol.network.egress import PORTS_OF_A_HOST_WITHOUT_PORT, is_loopback, outcome_text

Judge = Callable[[str, "int | None"], "tuple[bool, str]"]
_own = threading.local()
_INET = (socket.AF_INET, socket.AF_INET6)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def _port(value: Any) -> int | None:
    if isinstance(value, int):
        return value
    text = value.decode("ascii", "ignore") if isinstance(value, bytes) else value
    return int(text) if isinstance(text, str) and text.isdigit() else None


def _host(value: Any) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("idna", "ignore")
    return value.lower().rstrip(".") if isinstance(value, str) and value else None


class NetworkGuard:
    def __init__(
        self,
        judge: Judge,
        tcp_floor: tuple[int, ...] | None = None,
        local: LocalLinks | None = None,
        direct_refusal: str | None = None,
        own_ports: tuple[int, ...] = (),
    ) -> None:
        self._judge = judge
        # Loopback ports that are the kernel's own whoever listens (the fallback's egress proxy, its
        # own links' ports held before Landlock's TCP rule): never judged.
        self.own_ports = own_ports
        # In an OS sandbox without a network: every direct link but the kernel's own is refused with
        # this text (``{host}`` filled in), asking nobody; the host's egress proxy is the way out.
        self.direct_refusal = direct_refusal
        self.local = local  # the kernel's own loopback links are not judged (see local_links)
        self.tcp_floor = tcp_floor  # ports the OS lets this kernel connect to; None: no floor
        self.starting = True
        self._decisions: dict[tuple[str, int | None], tuple[bool, str]] = {}
        # (address, port) of allowed names; port None: the name was allowed on every port.
        self._allowed_ips: set[tuple[str, int | None]] = set()
        self._names: dict[str, str] = {}  # address -> the allowed name it came from
        # host -> port -> what became of it, for the running execution (port None: a lookup without one)
        self._outcomes: dict[str, dict[int | None, list[str]]] = {}

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if not event.startswith("socket.") or getattr(_own, "busy", False):
            return
        if event == "socket.getaddrinfo":
            self._lookup(_host(args[0]), _port(args[1]))
        elif event in ("socket.gethostbyname", "socket.gethostbyname_ex"):
            self._lookup(_host(args[0]), None)
        elif event == "socket.gethostbyaddr":  # a PTR query goes to DNS like any lookup
            host = _host(args[0])
            if host is not None and not is_loopback(host) and host != _host(socket.gethostname()):
                self._connect(host, None)
        elif event in ("socket.connect", "socket.sendto", "socket.sendmsg"):
            address = args[1]
            if isinstance(address, tuple) and len(address) >= 2:  # AF_INET / AF_INET6; AF_UNIX is a path
                host, port = _host(address[0]), _port(address[1])
                self._connect(host, port)
                self._check_floor(args[0], host, port)

    def _lookup(self, host: str | None, port: int | None) -> None:
        if host is None or _is_ip(host) or self.starting:
            return
        self._decide(host, port)

    def _connect(self, host: str | None, port: int | None) -> None:
        if host is None or self.starting:
            return
        if _is_ip(host) and ((host, port) in self._allowed_ips or (host, None) in self._allowed_ips):
            return  # an address of a name already judged (and listed), on a port it was allowed for
        self._decide(host, port)

    def _check_floor(self, sock: Any, host: str | None, port: int | None) -> None:
        """Refuse, with the reason, a TCP connect the floor would refuse with a bare EACCES."""
        floor = self.tcp_floor
        if floor is None or port is None or port in floor or host is None:
            return
        if getattr(sock, "family", None) not in _INET or getattr(sock, "type", None) != socket.SOCK_STREAM:
            return  # UDP and the rest: the floor does not limit them
        host = self._names.get(host, host)  # the name the code asked for, when it gave one
        # This very connect was just noted as allowed by the guard; what became of it is the refusal.
        self._note(host, port, f"refused (port {port} is outside the TCP floor)", replaces_last=True)
        raise PermissionError(errno.EACCES, floor_refusal(host, port, floor))

    def _decide(self, host: str, port: int | None) -> None:
        if port is not None and port in self.own_ports and is_loopback(host):
            return
        if self.direct_refusal is None and self.local is not None and self.local.own(host, port):
            return  # the kernel talking to itself (a forked child, the debugger, a local cluster)
        if self.direct_refusal is not None:
            if is_loopback(host) and self.tcp_floor is None:
                # The sandbox's loopback is its own (the relay, the debugger, a local cluster): the
                # person's machine is reached only through the proxy, so nothing here is judged.
                return
            why = "no direct network in the sandbox" if self.tcp_floor is None else "only the proxy is reachable"
            self._note(host, port, f"refused ({why})")
            raise socket.gaierror(socket.EAI_NONAME, audience.addressed(self.direct_refusal.format(host=host)))
        key = (host, port)
        decision = self._decisions.get(key)
        if decision is None:
            decision = self._judge(host, port)
            self._decisions[key] = decision
            if decision[0] and not _is_ip(host):
                self._learn_addresses(host, port)
        allowed, reason = decision
        self._note(host, port, outcome_text(allowed, reason))
        if not allowed:
            raise socket.gaierror(
                socket.EAI_NONAME,
                audience.addressed(
                    f"ivralo network guard: {host} refused ({reason}). Code here may reach only allowed hosts; "
                    f"to allow it, the person adds it to .ivralo/permissions.json under hosts.allow, or answers "
                    f"yes when asked. {audience.TELL_THE_PERSON}"
                ),
            )

    def _learn_addresses(self, host: str, port: int | None) -> None:
        """An allowed name's addresses are allowed at connect (the hook never sees lookup results)."""
        _own.busy = True
        try:
            for *_, sockaddr in socket.getaddrinfo(host, port):
                self._allowed_ips.add((str(sockaddr[0]), port))
                self._names[str(sockaddr[0])] = host
        except OSError:
            pass  # the code's own lookup will fail the same way, with the resolver's message
        finally:
            _own.busy = False

    def _note(self, host: str, port: int | None, outcome: str, replaces_last: bool = False) -> None:
        """Every distinct outcome per (host, port) is listed, in order."""
        seen = self._outcomes.setdefault(host, {}).setdefault(port, [])
        if replaces_last and seen:
            seen.pop()
        if outcome not in seen:
            seen.append(outcome)

    def note_proxied(self, host: str, port: int | None, allowed: bool, reason: str) -> None:
        """What the host's egress proxy decided for this execution (a subprocess's request too)."""
        self._note(host, port, outcome_text(allowed, reason))

    @property
    def attempts(self) -> dict[str, str]:
        """host -> what became of it: ``allowed (hosts.allow)``, or several ``; port N ...`` parts."""
        listed: dict[str, str] = {}
        for host, by_port in self._outcomes.items():
            parts: list[str] = []
            for port, outcomes in by_port.items():
                for outcome in outcomes:
                    if not any(part.endswith(outcome) for part in parts):
                        parts.append(outcome if not parts else f"port {port} {outcome}")
            listed[host] = "; ".join(parts)
        return listed

    def take_attempts(self) -> dict[str, str]:
        attempts = self.attempts
        self._outcomes = {}
        return attempts


def floor_refusal(host: str, port: int, floor: tuple[int, ...]) -> str:
    allowed = f"ports {', '.join(map(str, floor))}" if floor else "no port at all (no host was allowed then)"
    always = ' (or answers "always" when asked)' if port in PORTS_OF_A_HOST_WITHOUT_PORT else ""
    return audience.addressed(
        f"ivralo network guard: {host} port {port} is allowed, but this kernel's TCP floor (Landlock, "
        f"fixed when the kernel started) lets its processes connect only to {allowed}. To reach it, the "
        f'person adds "{host}:{port}" to .ivralo/permissions.json under hosts.allow{always} and restarts '
        f"the kernel. {audience.TELL_THE_PERSON}"
    )


def install_network_guard(
    judge: Judge,
    tcp_floor: tuple[int, ...] | None = None,
    tree_root: int | None = None,
    direct_refusal: str | None = None,
    own_ports: tuple[int, ...] = (),
) -> NetworkGuard:
    """``tcp_floor``: the ports the Landlock TCP floor allows, when one is in force. ``tree_root``: the
    process whose tree is the kernel's own (its supervisor); loopback ports it listens on are not judged.
    ``direct_refusal``: the kernel runs in a sandbox without a network (see ``NetworkGuard``)."""
    guard = NetworkGuard(judge, tcp_floor, LocalLinks(tree_root) if tree_root else None, direct_refusal, own_ports)
    sys.addaudithook(guard)
    return guard


def hosts_tried_line(attempts: dict[str, str]) -> str:
    return "[ivralo network: " + ", ".join(f"{host} {what}" for host, what in attempts.items()) + "]"
