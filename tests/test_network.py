"""The network guard, on loopback only (127.0.0.0/8 and the name localhost): allowed, refused,
asked (yes / always / no), unattended, through urllib, requests, httpx, asyncio and raw _socket;
the deadline paused while a person answers; the hosts-tried line after the output."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import loopback_http

from ivralo_kernel.host import Session, WorkerConfig
from ivralo_kernel.host.sandbox.egress import untrusted_note
from ivralo_kernel.protocol.trust import set_trust


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    """HTTP servers on 127.0.0.1 (localhost) and 127.0.0.2, on one port; 127.0.0.3 has none."""
    with loopback_http("127.0.0.1", "127.0.0.2") as port:
        yield port


# These tests are about the answer, on a random port: the TCP floor (fixed at start, ports of the
# allowed hosts only) would refuse it. test_network_floor.py tests an answer under the floor.
NO_TCP_FLOOR = WorkerConfig(landlock_network=False, sandbox="off")
# This file is the Python guard as it is without the OS sandbox (its fallback mode); inside the
# sandbox, HTTP goes through the host's proxy and direct sockets are refused (test_sandbox.py).
FALLBACK = WorkerConfig(sandbox="off")


def allow(ws: Path, *hosts: str) -> None:
    (ws / ".ivralo").mkdir(exist_ok=True)
    (ws / ".ivralo" / "permissions.json").write_text(json.dumps({"hosts": {"allow": list(hosts)}}))


CLIENTS = {
    "urllib": "import urllib.request\nprint(urllib.request.urlopen('http://{host}:{port}/').status)",
    "requests": "import requests\nprint(requests.get('http://{host}:{port}/', timeout=10).status_code)",
    "httpx": "import httpx\nprint(httpx.get('http://{host}:{port}/', timeout=10).status_code)",
    "asyncio": (
        "import asyncio\nr, w = await asyncio.open_connection('{host}', {port})\n"
        "w.write(b'GET / HTTP/1.0\\r\\n\\r\\n'); await w.drain()\nprint(int((await r.readline()).split()[1]))\n"
        "w.close()"
    ),
    "_socket": (
        "import _socket\ns = _socket.socket()\ns.connect(('{host}', {port}))\ns.send(b'GET / HTTP/1.0\\r\\n\\r\\n')\n"
        "print(int(s.recv(100).split()[1]))\ns.close()"
    ),
}


# HTTP_PROXY: these go through the host's egress proxy; the others connect directly, which the
# fallback's TCP rule allows only to the allowed hosts' ports with landlock_network.
PROXIED = ("urllib", "requests", "httpx")
DIRECT_LINKS = WorkerConfig(landlock_network=True, sandbox="off")


@pytest.mark.parametrize("client", CLIENTS)
async def test_allowed_host_through_every_client(workspace: Path, server: int, client: str) -> None:
    allow(workspace, f"localhost:{server}", f"127.0.0.2:{server}")  # with the port: the TCP floor opens it
    host = "127.0.0.2" if client == "_socket" else "localhost"
    config = FALLBACK if client in PROXIED else DIRECT_LINKS
    async with Session(workspace=workspace, config=config) as session:
        result = await session.run(CLIENTS[client].format(host=host, port=server))
    assert isinstance(result, str), result
    assert result.startswith("200\n")
    assert result.endswith(f"[ivralo network: {host} allowed (hosts.allow)]\n")


@pytest.mark.parametrize("client", CLIENTS)
async def test_unattended_unknown_host_is_refused(workspace: Path, server: int, client: str) -> None:
    async with Session(workspace=workspace, config=FALLBACK) as session:  # ask=None: nobody watches
        result = await session.run(CLIENTS[client].format(host="127.0.0.3", port=server))
    if client in PROXIED:  # the proxy's 403 (urllib raises it; requests and httpx return it)
        said = result if isinstance(result, str) else result["error"] + result["result"]
        assert "403" in said and "[ivralo network: 127.0.0.3 refused (nobody to ask)]" in said, said
        return
    assert isinstance(result, dict), result
    assert "127.0.0.3 cannot be reached by a direct connection" in result["error"], result
    assert "[ivralo network: 127.0.0.3 refused (only the proxy is reachable)]" in result["result"]


async def test_asked_yes_once_lasts_the_worker(workspace: Path, server: int) -> None:
    asked: list[tuple[str, tuple[str, ...]]] = []

    async def ask(question: str, choices: tuple[str, ...]) -> str:
        asked.append((question, choices))
        return "yes"

    code = CLIENTS["urllib"].format(host="localhost", port=server)
    async with Session(workspace=workspace, ask=ask, config=NO_TCP_FLOOR) as session:
        first = await session.run(code)
        second = await session.run(code)
    question = f"Code in run_python wants to reach localhost, this machine, port {server}"
    question += untrusted_note(os.path.realpath(workspace))  # "always" is offered once the folder is trusted
    assert asked == [(question, ("yes", "no"))], "asked once, no 'always' offer"
    assert isinstance(first, str) and first.endswith("[ivralo network: localhost allowed until this kernel restarts]\n")
    assert isinstance(second, str) and second.startswith("200\n")
    assert not (workspace / ".ivralo" / "permissions.json").exists()


async def test_asked_always_is_written_in_a_trusted_folder(workspace: Path, server: int) -> None:
    set_trust(str(workspace), True, __import__("os").environ)
    choices_seen: list[tuple[str, ...]] = []

    async def ask(question: str, choices: tuple[str, ...]) -> str:
        choices_seen.append(choices)
        return "always"

    async with Session(workspace=workspace, ask=ask, config=NO_TCP_FLOOR) as session:
        result = await session.run(CLIENTS["urllib"].format(host="localhost", port=server))
    assert choices_seen == [("yes", "always", "no")]
    assert isinstance(result, str) and "localhost allowed (always: recorded in .ivralo/permissions.json)" in result
    saved = json.loads((workspace / ".ivralo" / "permissions.json").read_text())
    assert saved == {"hosts": {"allow": [f"localhost:{server}"]}}, "on this machine: that port alone"


async def test_asked_no_is_refused(workspace: Path, server: int) -> None:
    async def ask(question: str, choices: tuple[str, ...]) -> str:
        return "no"

    async with Session(workspace=workspace, ask=ask, config=FALLBACK) as session:
        result = await session.run(CLIENTS["urllib"].format(host="localhost", port=server))
    assert isinstance(result, dict)
    assert "localhost refused (the person said no)" in result["error"]


async def test_the_deadline_is_paused_while_the_person_answers(workspace: Path, server: int) -> None:
    async def slow_person(question: str, choices: tuple[str, ...]) -> str:
        await asyncio.sleep(5)  # longer than the 2 s deadline
        return "yes"

    config = WorkerConfig(deadline_ms=2_000, interrupt_grace_ms=500, landlock_network=False, sandbox="off")
    async with Session(workspace=workspace, ask=slow_person, config=config) as session:
        result = await session.run(CLIENTS["urllib"].format(host="localhost", port=server))
    assert isinstance(result, str), result
    assert result.startswith("200\n")


async def test_malformed_permissions_fail_closed(workspace: Path, server: int) -> None:
    (workspace / ".ivralo").mkdir()
    (workspace / ".ivralo" / "permissions.json").write_text('{\n "hosts": {\n  "allow": "localhost"\n }\n}')
    async with Session(workspace=workspace, config=FALLBACK) as session:
        result = await session.run(CLIENTS["urllib"].format(host="localhost", port=server))
    assert isinstance(result, dict)
    assert 'permissions.json: line 3: field "hosts.allow" must be a list' in result["error"]


@pytest.mark.fast
def test_an_allowed_names_addresses_are_allowed_only_on_its_port() -> None:
    """Learning 127.0.0.1 from localhost:1111 must not open 127.0.0.1:2222 (no kernel needed)."""
    import socket

    from ivralo_kernel.guards.network import NetworkGuard

    asked: list[tuple[str, int | None]] = []

    def judge(host: str, port: int | None) -> tuple[bool, str]:
        asked.append((host, port))
        return (host, port) == ("localhost", 1111), "test"

    guard = NetworkGuard(judge)
    guard.starting = False
    guard("socket.getaddrinfo", ("localhost", 1111, 0, 0, 0, 0))
    with socket.socket() as sock:
        guard("socket.connect", (sock, ("127.0.0.1", 1111)))  # learned: not asked again
        with pytest.raises(socket.gaierror, match=r"127\.0\.0\.1 refused"):
            guard("socket.connect", (sock, ("127.0.0.1", 2222)))
    assert asked == [("localhost", 1111), ("127.0.0.1", 2222)]
    assert guard.take_attempts() == {"localhost": "allowed (test)", "127.0.0.1": "refused (test)"}


def test_own_loopback_listeners_are_told_from_a_persons_server() -> None:
    """The kernel's own listeners are found with sock_diag (what ``ss`` uses), the same sockets
    /proc/net/tcp lists; a listener outside the tree stays outside when asked again (cached)."""
    import os
    import socket
    import subprocess
    import sys

    from ivralo_kernel.guards import local_links

    with socket.socket() as mine, socket.socket(socket.AF_INET6) as mine6:
        mine.bind(("127.0.0.1", 0))
        mine.listen()
        port = mine.getsockname()[1]
        mine6.bind(("::1", port))
        mine6.listen()
        found = local_links._diag_listening_inodes(port)
        assert found == local_links._proc_listening_inodes(port)
        assert len(found) == 2
        assert local_links.LocalLinks(os.getpid()).own("127.0.0.1", port)
    listener = "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
    listener += "print(s.getsockname()[1], flush=True); input()"
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    with (
        subprocess.Popen([sys.executable, "-c", listener], **pipes) as persons,  # type: ignore[call-overload]
        subprocess.Popen([sys.executable, "-c", "input()"], stdin=subprocess.PIPE) as kernel,  # a tree without it
    ):
        try:
            theirs = int(persons.stdout.readline())
            links = local_links.LocalLinks(kernel.pid)
            assert not links.own("127.0.0.1", theirs)
            assert not links.own("127.0.0.1", theirs)
            assert local_links._diag_listening_inodes(theirs) == local_links._proc_listening_inodes(theirs) != set()
        finally:
            for process in (persons, kernel):
                process.kill()
