"""The credential broker's API calls, against HTTP servers on 127.0.0.1 that check the key.

The key lives in the host's environment only. Each test looks for it where it must never be: the
kernel's and the supervisor's /proc environ, everything the cell printed, the record line, and the
host's log. Hostile input is sent the way user code could send it: through the broker client with
malformed payloads, and as messages signed with the kernel's own key but not tied to a running
execution.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from ivralo_kernel.host import Session

KEY = "sk-broker-test-5f1d2a9c7e"
KEY_NAME = "IVRALO_TEST_API_KEY"


@dataclass
class Endpoint:
    port: int
    hits: list[str] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    slow_started: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    """/search answers JSON (and echoes the key back, as careless APIs do); /big is 200 kB;
    /slow waits until released; /redirect points at /search. 401 without the right key."""
    state = Endpoint(0)

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            state.hits.append(self.path)
            if self.headers.get("Authorization") != f"Bearer {KEY}":
                self._send(401, {"error": "no key"})
            elif self.path.startswith("/slow"):
                state.slow_started.set()
                state.release.wait(30)
                self._send(200, {"slow": True})
            elif self.path.startswith("/big"):
                self._send(200, {"blob": "x" * 200_000})
            elif self.path.startswith("/redirect"):
                self.send_response(302)
                self.send_header("Location", f"http://127.0.0.1:{state.port}/search?stolen=1")
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                self._send(200, {"authorized": True, "path": self.path, "echo": f"your key is {KEY}"})

        def _send(self, status: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = int(httpd.server_address[1])
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


@pytest.fixture
def operations(endpoint: Endpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Operations in a private config home (where code in the kernel cannot write), and the key."""
    home = tmp_path / "config-home"
    home.mkdir()
    base = f"http://127.0.0.1:{endpoint.port}"
    spec = {
        "operations": {
            "test.search": {
                "description": "Search the test endpoint",
                "url": f"{base}/search",
                "credential": KEY_NAME,
                "auth": {"kind": "bearer"},
                "params": {
                    "q": {"type": "string", "required": True, "max_length": 50},
                    "n": {"type": "integer", "minimum": 1, "maximum": 10},
                },
            },
            "test.item": {
                "url": f"{base}/items/{{item}}",
                "credential": KEY_NAME,
                "params": {"item": {"required": True}},
            },
            "test.big": {"url": f"{base}/big", "credential": KEY_NAME, "max_response_bytes": 10_000},
            "test.slow": {"url": f"{base}/slow", "credential": KEY_NAME},
            "test.redirect": {"url": f"{base}/redirect", "credential": KEY_NAME},
        }
    }
    (home / "apis.json").write_text(json.dumps(spec), encoding="utf-8")
    monkeypatch.setenv("IVRALO_CONFIG_HOME", str(home))
    monkeypatch.setenv(KEY_NAME, KEY)
    return home


RECORD = re.compile(r"\[ivralo answered this code's calls: (.+)\]\n")


def text_of(result: object) -> str:
    return result if isinstance(result, str) else json.dumps(result)


async def test_a_call_succeeds_and_the_key_stays_with_the_host(
    workspace: Path, endpoint: Endpoint, operations: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with Session(workspace=workspace, grants=("test",)) as session:
        result = await session.run(
            "r = ivralo.call('test.search', q='cats', n=3)\nprint(r.status, r.body['authorized'], r.body['path'])\n"
            "print(r.body['echo'])\nr"
        )
        assert isinstance(result, str), result
        assert "200 True /search?q=cats&n=3\n" in result
        assert f"your key is <{KEY_NAME}>\n" in result  # the endpoint echoed it; the host redacted it
        assert "<ApiResponse test.search: HTTP 200, application/json>" in result
        record = RECORD.search(result)
        assert record is not None, result
        assert re.fullmatch(rf"test\.search with {KEY_NAME} \(1 call, \d+\.\ds\)", record.group(1))
        # Two calls of one operation and one of another: one entry each, counted.
        result2 = await session.run(
            "ivralo.call('test.search', q='a'); ivralo.call('test.search', q='b')\n"
            "print(ivralo.call('test.item', item='a b/../c').body['path'])"
        )
        assert isinstance(result2, str), result2
        assert result2.startswith("/items/a%20b%2F..%2Fc\n")  # a parameter cannot change the path
        record2 = RECORD.search(result2)
        assert record2 is not None
        assert re.fullmatch(
            rf"test\.search with {KEY_NAME} \(2 calls, \d+\.\ds\), test\.item with {KEY_NAME} \(1 call, \d+\.\ds\)",
            record2.group(1),
        )
        environ = await session.run(
            "import os, subprocess\n"
            "print(sorted(k for k in os.environ if 'KEY' in k))\n"
            "print(subprocess.run(['env'], capture_output=True, text=True).stdout.count('sk-broker'))"
        )
        assert environ == "[]\n0\n"
        assert session.pid is not None and session.supervisor_pid is not None
        for pid in (session.pid, session.supervisor_pid):
            assert KEY.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
    assert endpoint.hits.count("/search?q=cats&n=3") == 1
    everything = result + result2 + environ + caplog.text
    assert KEY not in everything
    assert f"test.search with {KEY_NAME}" in caplog.text  # the host's log names the credential


async def test_refusals_name_the_grant_the_operation_and_the_parameter(
    workspace: Path, endpoint: Endpoint, operations: Path
) -> None:
    checks = {
        "ivralo.call('test.search', q='x')": 'BrokerRefused: refused: this kernel has no "test" grant',
        "ivralo.sql('demo', 'select 1')": 'BrokerRefused: refused: this kernel has no "databases" grant',
    }
    async with Session(workspace=workspace, grants=()) as session:
        for code, expected in checks.items():
            result = await session.run(code)
            assert isinstance(result, dict), result
            assert expected in result["error"], result["error"]
        listing = await session.run("for name, what in ivralo.operations().items(): print(name, '|', what)")
    assert isinstance(listing, str)
    assert 'test.search(q: string, n: integer = None) — Search the test endpoint (needs the "test" grant)' in listing
    assert "photos.search(query: string" in listing
    checks = {
        "ivralo.call('nope.nothing')": "unknown operation 'nope.nothing' (this host knows: photos.search, test.big",
        "ivralo.call('test.search')": 'test.search: parameter "q" is required',
        "ivralo.call('test.search', q=5)": 'test.search: parameter "q" must be string, not int',
        "ivralo.call('test.search', q='x', n=99)": 'test.search: parameter "n" must be between 1 and 10',
        "ivralo.call('test.search', q='x' * 51)": 'test.search: parameter "q" is longer than 50 characters',
        "ivralo.call('test.search', q='x', url='http://evil')": "test.search: unknown parameter 'url' (it takes: q, n)",
        "ivralo.call('test.search', q='x', n=True)": 'test.search: parameter "n" must be integer, not bool',
    }
    async with Session(workspace=workspace, grants=("test",)) as session:
        for code, expected in checks.items():
            result = await session.run(code)
            assert isinstance(result, dict), (code, result)
            assert "BrokerRefused: " + expected in result["error"], (code, result["error"])
            assert "ivralo answered" not in result["result"]  # a refused call is no call
    assert endpoint.hits == []


async def test_oversize_and_redirect_are_not_followed(workspace: Path, endpoint: Endpoint, operations: Path) -> None:
    async with Session(workspace=workspace, grants=("test",)) as session:
        big = await session.run("ivralo.call('test.big')")
        redirect = await session.run("r = ivralo.call('test.redirect'); print(r.status, r.ok)")
    assert isinstance(big, dict)
    assert (
        "BrokerError: test.big: the response is larger than the operation's cap of 10000 bytes (max_response_bytes)"
        in big["error"]
    )
    assert isinstance(redirect, str), redirect
    assert redirect.startswith("302 False\n")
    assert endpoint.hits == ["/big", "/redirect"]  # the credential was not carried to the new location


FORGE = """
import threading
from ivralo_kernel.kernel.broker_client import BROKER
from ivralo_kernel.protocol import broker_frames
kernel = get_ipython().kernel
BROKER._start_reader(BROKER._socket)  # its answers are read as the client's are

def forged(req_id, kind, payload, parent_id):  # written on the broker's socket, as code here can
    done, box = threading.Event(), []
    BROKER._pending[req_id] = (done, box)
    request = {{"req_id": req_id, "kind": kind, "payload": payload, "parent": parent_id}}
    BROKER._socket.sendall(broker_frames.encode(request))
    assert done.wait(10), "no answer"
    return box[0]

print("forged:", forged("f1", "api", {{"operation": "test.search", "params": {{"q": "x"}}}}, "not-running")["error"])
running = kernel.get_parent("shell")["header"]["msg_id"]
unasked = {{"host": "127.0.0.1", "port": 1, "choice": "always"}}
print("answer:", forged("f2", "egress_answer", unasked, running)["reason"])
for kind, payload in {cases}:
    answer = BROKER.ask(kind, payload, 10)
    print("malformed:", answer.get("error") or answer.get("reason"))
"""


async def test_forged_and_malformed_requests_fail_closed(workspace: Path, endpoint: Endpoint, operations: Path) -> None:
    cases = [
        ("api", {"operation": 5}),
        ("api", "not a dict"),
        ("api", {"operation": "test.search", "params": ["q", "x"]}),
        ("sql", {"database": None}),
        ("launch_missiles", {}),
        ("egress", {"host": "a b", "port": 80}),
        ("egress", {"host": "localhost", "port": "80"}),
    ]
    async with Session(workspace=workspace, grants=("test", "databases")) as session:
        result = await session.run(FORGE.format(cases=repr(cases)))
    assert isinstance(result, str), result
    lines = result.splitlines()
    assert lines[0] == "forged: the request is not from a running execution (a forged or late message)"
    assert lines[1] == "answer: an answer sent from the kernel counts for nothing: the host asks the person itself"
    assert lines[2:9] == [
        "malformed: malformed call: give the operation's name and its parameters",
        "malformed: malformed call: give the operation's name and its parameters",
        "malformed: test.search: parameters must be given as name=value",
        "malformed: malformed query: give the database's name and the SQL text",
        "malformed: unknown request kind 'launch_missiles'",
        "malformed: malformed egress request",
        "malformed: malformed egress request",
    ]
    assert endpoint.hits == []
    assert not (workspace / ".ivralo" / "permissions.json").exists()


async def test_an_interrupt_ends_the_wait_at_once(workspace: Path, endpoint: Endpoint, operations: Path) -> None:
    async with Session(workspace=workspace, grants=("test",)) as session:
        assert await session.run("kept = 42") == ""
        call = asyncio.create_task(session.run("ivralo.call('test.slow')"))
        deadline = time.monotonic() + 30
        while not endpoint.slow_started.is_set():  # the host's request reached the endpoint
            assert time.monotonic() < deadline and not call.done(), "the call never reached the endpoint"
            await asyncio.sleep(0.01)
        worker = session._worker
        assert worker is not None
        await worker.km.interrupt_kernel()
        result = await asyncio.wait_for(call, 10)  # liveness only: the endpoint below still holds the call
        assert isinstance(result, dict), result
        assert "KeyboardInterrupt" in result["error"]
        assert not endpoint.release.is_set(), "the call ended by the interrupt, not by the endpoint's answer"
        endpoint.release.set()
        assert await session.run("print(kept)") == "42\n"  # the kernel and its namespace survived


def test_the_record_line_is_saved_in_the_notebook(
    workspace: Path, endpoint: Endpoint, operations: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernelspec installed with --grant (host-side config the code cannot write), run by nbclient."""
    from ivralo_kernel.cli import main as cli

    prefix = tmp_path / "prefix"
    assert cli(["install", "--prefix", str(prefix), "--name", "ivralo-granted", "--grant", "test"]) == 0
    monkeypatch.setenv("JUPYTER_PATH", f"{prefix}/share/jupyter")
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "ivralo-granted", "language": "python", "display_name": "granted"}
    nb.cells = [nbformat.v4.new_code_cell("r = ivralo.call('test.search', q='saved')\nprint(r.status)")]
    NotebookClient(
        nb, timeout=60, kernel_name="ivralo-granted", resources={"metadata": {"path": str(workspace)}}
    ).execute()
    path = workspace / "saved.ipynb"
    nbformat.write(nb, path)
    saved = path.read_text(encoding="utf-8")
    outputs = "".join(o.get("text", "") for o in nbformat.read(path, as_version=4).cells[0].outputs)
    assert outputs.startswith("200\n")
    assert re.search(
        rf"\[ivralo answered this code's calls: test\.search with {KEY_NAME} \(1 call, \d+\.\ds\)\]", outputs
    )
    assert KEY not in saved


async def test_calls_per_execution_are_limited(workspace: Path, endpoint: Endpoint, operations: Path) -> None:
    from ivralo_kernel.host.broker.responder import CALLS_PER_EXECUTION

    code = (
        f"for i in range({CALLS_PER_EXECUTION + 1}):\n"
        "    try:\n        ivralo.call('test.search', q=str(i))\n"
        "    except ivralo.BrokerRefused as refusal:\n        print(i, refusal)"
    )
    async with Session(workspace=workspace, grants=("test",)) as session:
        result = await session.run(code)
        again = await session.run("print(ivralo.call('test.search', q='next cell').status)")
    assert isinstance(result, str), result
    assert result.startswith(
        f"{CALLS_PER_EXECUTION} more than {CALLS_PER_EXECUTION} brokered calls from one execution; split the work\n"
    ), result
    assert f"({CALLS_PER_EXECUTION} calls, " in result  # the refused one is not on the record
    assert isinstance(again, str) and again.startswith("200\n")  # the next execution has its own budget
    assert len(endpoint.hits) == CALLS_PER_EXECUTION + 1
