"""[protocol] The egress policy file format: which hosts code in a kernel may reach.

Sources, merged: ``<workspace>/.ivralo/permissions.json`` and ``<config home>/permissions.json``,
each ``{"hosts": {"allow": ["api.example.com", "*.example.com", "127.0.0.1:8080"]}}``. A name
matches exactly (case-insensitive); ``*.example.com`` matches any subdomain (not example.com
itself); ``host:port`` limits an entry to one port. Loopback is judged like any host; the keyword
``loopback`` (or ``loopback:8080``) allows all of it at once: ``localhost``, ``*.localhost``,
127.0.0.0/8 and ``::1``. Everything else is unknown (asked about, or refused when nobody can answer).

The same entries set the kernel's TCP floor (Landlock, for subprocesses and native code, which the
Python-level guard never sees): TCP connect only to the ports they name, 80 and 443 for an entry
without a port, none at all when nothing is listed or the policy is closed.

A malformed file is reported with its path, line and field, and the policy then **fails closed**:
nothing from any file is allowed until the file is fixed, because a half-read grant list is a
grant list nobody wrote.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.config_files import read_json_file
from ivralo_kernel.protocol.credentials import config_home
from ivralo_kernel.protocol.network.egress_names import HostNameError, Target, is_this_machine, normalize

PERMISSIONS_FILE = "permissions.json"
# An entry without a port ("api.example.com") is reached over HTTP or HTTPS in nearly every case;
# opening every port for it would leave the floor with nothing to stop.
PORTS_OF_A_HOST_WITHOUT_PORT = (80, 443)


LOOPBACK = "loopback"  # the allow-list keyword for every loopback name and address
ALLOW_LIST = "hosts.allow"  # the reason of a decision the allow list made (the person's own entry)
# The reasons of the person's answers: "yes" lasts until the kernel restarts; "always" is written to the
# workspace's permissions file (named as the person finds it).
UNTIL_RESTART = "until this kernel restarts"
ALWAYS_RECORDED = f"always: recorded in {names.STATE_DIR}/{PERMISSIONS_FILE}"


def outcome_text(allowed: bool, reason: str) -> str:
    """What became of a host, as the hosts-tried line lists it: ``allowed (hosts.allow)``, ``refused
    (the person said no)``; a yes reads ``allowed until this kernel restarts``."""
    verdict = "allowed" if allowed else "refused"
    return f"{verdict} {reason}" if reason == UNTIL_RESTART else f"{verdict} ({reason})"


def is_loopback(host: str) -> bool:
    """Whether a connection to this name reaches this machine, in any spelling (see egress_names)."""
    return is_this_machine(host)


@dataclass(frozen=True)
class AllowEntry:
    host: str  # lower-cased; may start with "*."
    port: int | None = None

    def matches(self, target: Target, port: int | None) -> bool:
        """By what the name means (``0x7f000001`` is 127.0.0.1); a name entry also by the name as
        written (``*.localhost`` matches ``api.localhost``, which means localhost)."""
        if self.port is not None and port != self.port:
            return False
        if self.host == LOOPBACK:
            return target.this_machine
        spellings = {target.host} if target.numeric else {target.host, target.written}
        return any(self._matches(name) for name in spellings)

    def _matches(self, host: str) -> bool:
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and host != self.host[2:]
        return fnmatch.fnmatchcase(host, self.host) if "*" in self.host else host == self.host


@dataclass(frozen=True)
class EgressPolicy:
    allow: tuple[AllowEntry, ...] = ()
    problems: tuple[str, ...] = field(default=())

    @property
    def closed(self) -> bool:
        """A file could not be read: refuse everything, and say which file to fix."""
        return bool(self.problems)

    def connect_ports(self) -> tuple[int, ...]:
        """The TCP ports the floor lets any process of the kernel connect to, sorted."""
        if self.closed:
            return ()
        ports: set[int] = set()
        for entry in self.allow:
            ports.update((entry.port,) if entry.port is not None else PORTS_OF_A_HOST_WITHOUT_PORT)
        return tuple(sorted(ports))

    def judge(self, host: str, port: int | None) -> tuple[bool | None, str]:
        """(True: allowed | False: refused | None: unknown, the reason in a few words)."""
        if self.closed:
            return False, f"the permissions file is malformed ({self.problems[0]})"
        try:
            target = normalize(host)
        except HostNameError as exc:
            return False, str(exc)
        for entry in self.allow:
            if entry.matches(target, port):
                return True, ALLOW_LIST
        return None, "not in hosts.allow"


def _parse_entry(text: str, where: str) -> AllowEntry:
    host, sep, port = text.strip().rpartition(":") if text.count(":") == 1 else (text.strip(), "", "")
    if not sep:
        host, port = text.strip(), ""
    if not host or any(c.isspace() for c in host):
        raise ValueError(f'{where}: "{text}" is not a host name')
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f'{where}: "{text}" has a port that is not 1-65535')
    host = host.lower().rstrip(".")
    if "*" not in host and host != LOOPBACK:
        try:  # an address in any spelling is kept as the address it means ("127.1" is 127.0.0.1)
            meant = normalize(host)
        except HostNameError as exc:
            raise ValueError(f'{where}: "{text}" is not a host name ({exc})') from None
        host = meant.host if meant.numeric else host
    return AllowEntry(host, int(port) if port else None)


def _line_of(text: str, needle: str) -> int:
    index = text.find(json.dumps(needle))
    return text.count("\n", 0, index) + 1 if index >= 0 else 1


def read_permissions(path: Path) -> tuple[list[AllowEntry], list[str]]:
    """Entries and problems (each naming the file, the line and the field) from one file."""
    text, data, problem = read_json_file(path)
    if problem is not None:
        return [], [problem]
    if text is None:
        return [], []
    hosts = data.get("hosts", {}) if isinstance(data, dict) else None
    if not isinstance(hosts, dict):
        return [], [f'{path}: line 1: field "hosts" must be an object like {{"allow": ["api.example.com"]}}']
    allow = hosts.get("allow", [])
    if not isinstance(allow, list):
        return [], [f'{path}: line {_line_of(text, "allow")}: field "hosts.allow" must be a list of host names']
    entries, problems = [], []
    for item in allow:
        where = f'{path}: line {_line_of(text, str(item))}: field "hosts.allow"'
        if not isinstance(item, str):
            problems.append(f"{where}: {item!r} is not a string")
            continue
        try:
            entries.append(_parse_entry(item, where))
        except ValueError as exc:
            problems.append(str(exc))
    return entries, problems


def load_egress_policy(
    workspace: str, env: Mapping[str, str] = os.environ, include_workspace: bool = True
) -> EgressPolicy:
    """The allow list: the workspace's permissions.json (unless the host set it aside: see
    host.config_watch), then the config home's."""
    entries: list[AllowEntry] = []
    problems: list[str] = []
    paths = [Path(workspace) / names.STATE_DIR / PERMISSIONS_FILE] if include_workspace else []
    for path in (*paths, config_home(env) / PERMISSIONS_FILE):
        found, wrong = read_permissions(path)
        entries += found
        problems += wrong
    return EgressPolicy(tuple(entries), tuple(problems))
