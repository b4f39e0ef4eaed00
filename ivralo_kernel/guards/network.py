"""[guards] The network guard: every host the code tries to reach is judged before the name goes
anywhere, not even to DNS (changes process state through the audit hook it installs).

Lookups (``socket.getaddrinfo``, ``gethostbyname*``) are judged by name; IP literals pass the
lookup and are judged at ``connect``/``connect_ex``/``sendto``, where an address that came from an
allowed name is allowed. The audit hook sees ``_socket`` and ``importlib.reload(socket)`` too.
A refusal is a ``socket.gaierror`` carrying the reason, so urllib, requests, httpx and asyncio fail
the way they already know how to. The judge (who asks the host) is injected by the kernel room.
Not covered: ctypes, subprocesses (the Landlock TCP floor is the answer there), UDP beyond sendto.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

Judge = Callable[[str, "int | None"], "tuple[bool, str]"]
_own = threading.local()


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
    def __init__(self, judge: Judge) -> None:
        self._judge = judge
        self.starting = True
        self._decisions: dict[tuple[str, int | None], tuple[bool, str]] = {}
        self._allowed_ips: set[str] = set()
        self.attempts: dict[str, str] = {}  # host -> what became of it, for the running execution

    def __call__(self, event: str, args: tuple[Any, ...]) -> None:
        if not event.startswith("socket.") or getattr(_own, "busy", False):
            return
        if event == "socket.getaddrinfo":
            self._lookup(_host(args[0]), _port(args[1]))
        elif event in ("socket.gethostbyname", "socket.gethostbyname_ex"):
            self._lookup(_host(args[0]), None)
        elif event in ("socket.connect", "socket.sendto"):
            address = args[1]
            if isinstance(address, tuple) and len(address) >= 2:  # AF_INET / AF_INET6; AF_UNIX is a path
                self._connect(_host(address[0]), _port(address[1]))

    def _lookup(self, host: str | None, port: int | None) -> None:
        if host is None or _is_ip(host) or self.starting:
            return
        self._decide(host, port)

    def _connect(self, host: str | None, port: int | None) -> None:
        if host is None or self.starting:
            return
        if _is_ip(host) and host in self._allowed_ips:
            return  # an address of a name already judged (and listed) for this connection
        self._decide(host, port)

    def _decide(self, host: str, port: int | None) -> None:
        key = (host, port)
        decision = self._decisions.get(key)
        if decision is None:
            decision = self._judge(host, port)
            self._decisions[key] = decision
            if decision[0] and not _is_ip(host):
                self._learn_addresses(host, port)
        allowed, reason = decision
        self.attempts.setdefault(host, f"{'allowed' if allowed else 'refused'} ({reason})")
        if not allowed:
            raise socket.gaierror(
                socket.EAI_NONAME,
                f"ivralo network guard: {host} refused ({reason}). Code here may reach only allowed hosts; "
                f"to allow it, the person adds it to .ivralo/permissions.json under hosts.allow, or answers "
                f"yes when asked. Stop and tell the person, rather than looking for another way.",
            )

    def _learn_addresses(self, host: str, port: int | None) -> None:
        """An allowed name's addresses are allowed at connect (the hook never sees lookup results)."""
        _own.busy = True
        try:
            for *_, sockaddr in socket.getaddrinfo(host, port):
                self._allowed_ips.add(str(sockaddr[0]))
        except OSError:
            pass  # the code's own lookup will fail the same way, with the resolver's message
        finally:
            _own.busy = False

    def take_attempts(self) -> dict[str, str]:
        attempts, self.attempts = self.attempts, {}
        return attempts


def install_network_guard(judge: Judge) -> NetworkGuard:
    guard = NetworkGuard(judge)
    sys.addaudithook(guard)
    return guard


def hosts_tried_line(attempts: dict[str, str]) -> str:
    return "[ivralo network: " + ", ".join(f"{host} {what}" for host, what in attempts.items()) + "]"
