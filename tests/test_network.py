"""The network guard, on loopback only (127.0.0.0/8 and the name localhost): allowed, refused,
asked (yes / always / no), unattended, through urllib, requests, httpx, asyncio and raw _socket;
the deadline paused while a person answers; the hosts-tried line after the output."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ivralo_kernel.host import Session, WorkerConfig
from ivralo_kernel.protocol.trust import set_trust


@pytest.fixture(scope="module")
def server() -> Iterator[int]:
    """An HTTP server on 127.0.0.1 (also reachable as 127.0.0.2 etc.: all of 127/8 is loopback)."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Quiet)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


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
REFUSED = {
    "urllib": "URLError: <urlopen error [Errno -2] ivralo network guard: {host} refused ({why})",
    "requests": "ivralo network guard: {host} refused ({why})",
    "httpx": "ivralo network guard: {host} refused ({why})",
    "asyncio": "gaierror: [Errno -2] ivralo network guard: {host} refused ({why})",
    "_socket": "gaierror: [Errno -2] ivralo network guard: {host} refused ({why})",
}


@pytest.mark.parametrize("client", CLIENTS)
async def test_allowed_host_through_every_client(workspace: Path, server: int, client: str) -> None:
    allow(workspace, "localhost", "127.0.0.2")
    host = "127.0.0.2" if client == "_socket" else "localhost"
    async with Session(workspace=workspace) as session:
        result = await session.run(CLIENTS[client].format(host=host, port=server))
    assert isinstance(result, str), result
    assert result.startswith("200\n")
    assert result.endswith(f"[ivralo network: {host} allowed (hosts.allow)]\n")


@pytest.mark.parametrize("client", CLIENTS)
async def test_unattended_unknown_host_is_refused(workspace: Path, server: int, client: str) -> None:
    async with Session(workspace=workspace) as session:  # ask=None: nobody watches
        result = await session.run(CLIENTS[client].format(host="127.0.0.3", port=server))
    assert isinstance(result, dict), result
    assert REFUSED[client].format(host="127.0.0.3", why="nobody to ask") in result["error"]
    assert "[ivralo network: 127.0.0.3 refused (nobody to ask)]" in result["result"]


async def test_asked_yes_once_lasts_the_worker(workspace: Path, server: int) -> None:
    asked: list[tuple[str, tuple[str, ...]]] = []

    async def ask(question: str, choices: tuple[str, ...]) -> str:
        asked.append((question, choices))
        return "yes"

    code = CLIENTS["urllib"].format(host="localhost", port=server)
    async with Session(workspace=workspace, ask=ask) as session:
        first = await session.run(code)
        second = await session.run(code)
    assert asked == [("Code in run_python wants to reach localhost", ("yes", "no"))], "asked once, no 'always' offer"
    assert isinstance(first, str) and first.endswith("[ivralo network: localhost allowed (yes this time)]\n")
    assert isinstance(second, str) and second.startswith("200\n")
    assert not (workspace / ".ivralo" / "permissions.json").exists()


async def test_asked_always_is_written_in_a_trusted_folder(workspace: Path, server: int) -> None:
    set_trust(str(workspace), True, __import__("os").environ)
    choices_seen: list[tuple[str, ...]] = []

    async def ask(question: str, choices: tuple[str, ...]) -> str:
        choices_seen.append(choices)
        return "always"

    async with Session(workspace=workspace, ask=ask) as session:
        result = await session.run(CLIENTS["urllib"].format(host="localhost", port=server))
    assert choices_seen == [("yes", "always", "no")]
    assert isinstance(result, str) and "localhost allowed (always (hosts.allow))" in result
    saved = json.loads((workspace / ".ivralo" / "permissions.json").read_text())
    assert saved == {"hosts": {"allow": ["localhost"]}}


async def test_asked_no_is_refused(workspace: Path, server: int) -> None:
    async def ask(question: str, choices: tuple[str, ...]) -> str:
        return "no"

    async with Session(workspace=workspace, ask=ask) as session:
        result = await session.run(CLIENTS["urllib"].format(host="localhost", port=server))
    assert isinstance(result, dict)
    assert "localhost refused (the person said no)" in result["error"]


async def test_the_deadline_is_paused_while_the_person_answers(workspace: Path, server: int) -> None:
    async def slow_person(question: str, choices: tuple[str, ...]) -> str:
        await asyncio.sleep(5)  # longer than the 2 s deadline
        return "yes"

    config = WorkerConfig(deadline_ms=2_000, interrupt_grace_ms=500)
    async with Session(workspace=workspace, ask=slow_person, config=config) as session:
        result = await session.run(CLIENTS["urllib"].format(host="localhost", port=server))
    assert isinstance(result, str), result
    assert result.startswith("200\n")


async def test_malformed_permissions_fail_closed(workspace: Path, server: int) -> None:
    (workspace / ".ivralo").mkdir()
    (workspace / ".ivralo" / "permissions.json").write_text('{\n "hosts": {\n  "allow": "localhost"\n }\n}')
    async with Session(workspace=workspace) as session:
        result = await session.run(CLIENTS["urllib"].format(host="localhost", port=server))
    assert isinstance(result, dict)
    assert 'permissions.json: line 3: field "hosts.allow" must be a list' in result["error"]
