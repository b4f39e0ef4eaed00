"""The Landlock TCP floor (off by default; these tests ask for it), on loopback only: a subprocess
(curl) or a ctypes ``connect()`` from a cell reaches only the ports of the allowed hosts; nothing
allowed means no TCP connect; by default there is no floor; a host allowed at run time on another
port gets a PermissionError that says why; what the floor does not cover (a host not allowed on an
allowed port, UDP) behaves as documented.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from servers import loopback_http

from ivralo_kernel.guards.landlock import abi
from ivralo_kernel.guards.network import NetworkGuard
from ivralo_kernel.host import Session, WorkerConfig
from ivralo_kernel.host.jupyter.provisioner import IvraloProvisioner
from ivralo_kernel.protocol import ConfigError, KernelPolicy, names

ABI = abi()
# The TCP floor is a fallback-mode layer: inside the OS sandbox the network namespace replaces it.
FLOOR = WorkerConfig(landlock_network=True, sandbox="off")
needs_floor = pytest.mark.skipif(ABI < 4, reason=f"the TCP floor needs Landlock ABI >= 4 (this kernel has ABI {ABI})")

# Runs in the cell: curl each URL (no proxy: loopback only), print one JSON line
# {url: [exit code, body, verbose log]}. Refused by the floor, curl 7.88 exits 7 ("Couldn't connect
# to server") and its verbose log says "Immediate connect fail for 127.0.0.1: Permission denied"
# (EACCES), where a closed port would say "Connection refused".
CURL = """
import json, subprocess
runs = {{}}
for url in {urls!r}:
    done = subprocess.run(["curl", "-sSv", "--noproxy", "*", "-m", "5", url], capture_output=True, text=True)
    runs[url] = [done.returncode, done.stdout, done.stderr]
print(json.dumps(runs))
"""

# Runs in the cell: libc connect() through ctypes, which no audit hook sees; only the OS can refuse.
RAW_CONNECT = """
import ctypes, json, os, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
def raw_connect(port):
    with socket.socket() as s:
        address = struct.pack("=HH4s8x", socket.AF_INET, socket.htons(port), socket.inet_aton("127.0.0.1"))
        if libc.connect(s.fileno(), address, len(address)) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
outcomes = {{}}
for port in {ports!r}:
    try:
        raw_connect(port)
        outcomes[port] = "connected"
    except OSError as exc:
        outcomes[port] = f"{{type(exc).__name__}} {{exc.errno}}"
print(json.dumps(outcomes))
"""


@dataclass(frozen=True)
class Ports:
    allowed: int  # 127.0.0.1 and 127.0.0.2 listen here
    other: int  # 127.0.0.1 listens here


@pytest.fixture(scope="module")
def ports() -> Iterator[Ports]:
    with loopback_http("127.0.0.1", "127.0.0.2") as allowed, loopback_http("127.0.0.1") as other:
        yield Ports(allowed, other)


def allow(ws: Path, *entries: str) -> None:
    (ws / ".ivralo").mkdir(exist_ok=True)
    (ws / ".ivralo" / "permissions.json").write_text(json.dumps({"hosts": {"allow": list(entries)}}))


def first_json_line(result: str | dict[str, Any]) -> dict[str, Any]:
    assert isinstance(result, str), result
    record: dict[str, Any] = json.loads(result.splitlines()[0])
    return record


async def curl(session: Session, *urls: str) -> dict[str, tuple[int, str, str]]:
    record = first_json_line(await session.run(CURL.format(urls=list(urls))))
    return {url: (rc, body, log) for url, (rc, body, log) in record.items()}


async def floor_layer(session: Session) -> str:
    """The floor's ports; the fallback's own (the egress proxy's, the kernel's own links') as ``P``."""
    if not session.kernel_info:  # the worker starts with the first call
        assert isinstance(await session.run("pass"), str)
    layers = session.kernel_info[names.KERNEL_INFO_SECTION]["layers"]
    own = r"\d+ \(egress proxy\)(?:(?:, \d+)*?, \d+ \(the kernel's own links\))?"
    return re.sub(own, "P", str(layers["tcp_connect_floor"]), count=1)


def refused_by_floor(outcome: tuple[int, str, str]) -> bool:
    rc, _, log = outcome
    return rc == 7 and "Immediate connect fail for 127.0.0.1: Permission denied" in log


def answered_by(outcome: tuple[int, str, str]) -> str:
    rc, body, log = outcome
    assert rc == 0, log
    return body


@needs_floor
async def test_curl_reaches_only_the_ports_of_allowed_hosts(workspace: Path, ports: Ports) -> None:
    allow(workspace, f"127.0.0.1:{ports.allowed}")
    allowed, other = f"http://127.0.0.1:{ports.allowed}/", f"http://127.0.0.1:{ports.other}/"
    async with Session(workspace=workspace, config=FLOOR) as session:
        assert await floor_layer(session) == f"ports P, {ports.allowed}"
        runs = await curl(session, allowed, other)
    assert answered_by(runs[allowed]) == f"answered by 127.0.0.1:{ports.allowed}"
    assert refused_by_floor(runs[other]), runs[other]


@needs_floor
async def test_ctypes_connect_outside_the_floor_is_refused_by_the_os(workspace: Path, ports: Ports) -> None:
    allow(workspace, f"127.0.0.1:{ports.allowed}")
    async with Session(workspace=workspace, config=FLOOR) as session:
        result = await session.run(RAW_CONNECT.format(ports=[ports.allowed, ports.other]))
    outcomes = first_json_line(result)
    assert outcomes == {str(ports.allowed): "connected", str(ports.other): "PermissionError 13"}


@needs_floor
async def test_nothing_allowed_means_no_tcp_connect(workspace: Path, ports: Ports) -> None:
    url = f"http://127.0.0.1:{ports.allowed}/"
    async with Session(workspace=workspace, config=FLOOR) as session:
        assert await floor_layer(session) == "ports P"
        runs = await curl(session, url)
    assert refused_by_floor(runs[url]), runs[url]


@needs_floor
async def test_a_host_without_a_port_opens_80_and_443(workspace: Path) -> None:
    allow(workspace, "api.example.com", "*.example.org", "127.0.0.1:8080")
    async with Session(workspace=workspace, config=FLOOR) as session:
        assert await floor_layer(session) == "ports P, 80, 443, 8080"


@needs_floor
async def test_a_malformed_permissions_file_opens_no_port(workspace: Path) -> None:
    (workspace / ".ivralo").mkdir()
    (workspace / ".ivralo" / "permissions.json").write_text('{"hosts": {"allow": "127.0.0.1:8080"}}')
    async with Session(workspace=workspace, config=FLOOR) as session:
        assert await floor_layer(session) == "ports P"


@needs_floor
async def test_in_the_fallback_the_floor_is_the_proxys_port_by_default(workspace: Path, ports: Ports) -> None:
    """Without landlock_network, an allowed host too is reached only through the egress proxy."""
    allow(workspace, f"127.0.0.1:{ports.allowed}")
    allowed = f"http://127.0.0.1:{ports.allowed}/"
    async with Session(workspace=workspace, config=WorkerConfig(sandbox="off")) as session:
        assert await floor_layer(session) == "ports P"
        runs = await curl(session, allowed)
    assert refused_by_floor(runs[allowed]), runs[allowed]


@needs_floor
async def test_a_host_allowed_at_run_time_on_another_port_is_told_why(workspace: Path, ports: Ports) -> None:
    allow(workspace, f"127.0.0.1:{ports.allowed}")

    async def yes(question: str, choices: tuple[str, ...]) -> str:
        return "yes"

    code = (
        "import socket\n"
        f"try:\n    socket.create_connection(('localhost', {ports.other}), timeout=5)\n"
        "except OSError as exc:\n    print(type(exc).__name__, exc.errno, exc.strerror)\n"
    )
    async with Session(workspace=workspace, config=FLOOR, ask=yes) as session:
        result = await session.run(code)
    assert isinstance(result, str), result
    proxy = ", ".join(result.split("connect only to ports ", 1)[-1].split(", ")[:3])  # the fallback's own
    assert result.startswith(
        f"PermissionError 13 ivralo network guard: localhost port {ports.other} is allowed, but this kernel's "
        f"TCP floor (Landlock, fixed when the kernel started) lets its processes connect only to ports "
        f'{proxy}, {ports.allowed}. To reach it, the person adds "localhost:{ports.other}" to .ivralo/permissions.json '
        "under hosts.allow and restarts the kernel."
    ), result
    assert f"[ivralo network: localhost refused (port {ports.other} is outside the TCP floor)]" in result


@needs_floor
async def test_what_the_floor_does_not_cover(workspace: Path, ports: Ports) -> None:
    """Documented gaps, asserted so the documentation stays true: the floor knows ports, not hosts;
    UDP it does not cover, and with direct links allowed (this floor) the fallback's seccomp filter
    lets UDP through too, so that the allowed hosts' names resolve by DNS."""
    allow(workspace, f"127.0.0.1:{ports.allowed}")
    other_host = f"http://127.0.0.2:{ports.allowed}/"  # not allowed, but on the allowed port
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", 0))
        udp.settimeout(10)
        send_udp = (
            "import subprocess, sys\n"
            "subprocess.run([sys.executable, '-c', \"import socket; socket.socket(socket.AF_INET, "
            f"socket.SOCK_DGRAM).sendto(b'past the floor', ('127.0.0.1', {udp.getsockname()[1]}))\"]).returncode"
        )
        async with Session(workspace=workspace, config=FLOOR) as session:
            runs = await curl(session, other_host)
            sent = await session.run(send_udp)
        assert str(sent).strip() == "0", sent
        assert udp.recvfrom(100)[0] == b"past the floor"
    assert answered_by(runs[other_host]) == f"answered by 127.0.0.2:{ports.allowed}"


@pytest.mark.fast
def test_the_knob_reaches_the_policy_and_follows_the_write_floor() -> None:
    assert IvraloProvisioner().policy_for("/w").landlock_network is False
    assert IvraloProvisioner(landlock_network=True).policy_for("/w").landlock_network is True
    assert IvraloProvisioner(landlock=False, landlock_network=True).policy_for("/w").landlock_network is False
    assert KernelPolicy.from_env({}, "/w").landlock_network is False
    assert KernelPolicy.from_env({"IVRALO_LANDLOCK_NETWORK": "on"}, "/w").landlock_network is True
    with pytest.raises(ConfigError, match="landlock_network: 'no' is not True or False"):
        WorkerConfig(landlock_network="no")  # type: ignore[arg-type]


@pytest.mark.fast
def test_the_guard_checks_only_tcp_against_the_floor() -> None:
    """Called directly (never installed: an audit hook cannot be removed). Only AF_INET/AF_INET6
    SOCK_STREAM is checked, MPTCP and TCP sendto (Fast Open) included since Landlock misses them."""
    guard = NetworkGuard(lambda host, port: (True, "hosts.allow"), tcp_floor=(443,))
    guard.starting = False
    mptcp = 262  # IPPROTO_MPTCP, not named by the socket module of every Python
    kinds = {
        "tcp": (socket.AF_INET, socket.SOCK_STREAM, 0),
        "tcp6": (socket.AF_INET6, socket.SOCK_STREAM, 0),
        "mptcp": (socket.AF_INET, socket.SOCK_STREAM, mptcp),
        "udp": (socket.AF_INET, socket.SOCK_DGRAM, 0),
    }
    for family, kind, proto in kinds.values():
        try:
            sock = socket.socket(family, kind, proto)  # never connected: only the hook is called
        except OSError:  # no IPv6 or no MPTCP on this machine: nothing to check for that kind
            assert proto == mptcp or family == socket.AF_INET6
            continue
        with sock:
            address = ("::1", 8080) if family == socket.AF_INET6 else ("127.0.0.1", 8080)
            guard("socket.connect", (sock, ("127.0.0.1", 443)))  # on the floor: allowed
            for event in ("socket.connect", "socket.sendto"):
                if kind == socket.SOCK_DGRAM:
                    guard(event, (sock, address))  # UDP: the floor does not limit it
                    continue
                with pytest.raises(PermissionError, match="lets its processes connect only to ports 443"):
                    guard(event, (sock, address))
    assert guard.attempts["127.0.0.1"] == (
        "allowed (hosts.allow); port 8080 refused (port 8080 is outside the TCP floor)"
    )
