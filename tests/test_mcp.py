"""``ivralo-kernel mcp``, driven by the MCP SDK's own ``Client``: over stdio in both protocol modes
(the legacy handshake and the 2026 stateless one) and over streamable HTTP on 127.0.0.1.

Judged from outside the server and its kernels: a loopback HTTP server's hit count for the egress
answers, files on disk, ``/proc/<pid>/environ`` for credentials, and the process table (each
kernel's tree by pid) for "nothing outlives the server". Every case starts in a fresh folder with
nothing pre-allowed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import gone, kill_tree, wait_until, wait_until_async
from sandbox_cases import counting_http

pytest.importorskip("mcp")

from mcp import Client, StdioServerParameters
from mcp.types import ElicitResult

from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.trust import set_trust

MODES = ("legacy", "auto")
SECRET = "sk-ivralo-mcp-test-0123456789"
PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"
CURL = (
    "import subprocess\n"
    "print(subprocess.run(['sh', '-c', 'curl -sS http://127.0.0.1:{port}/sh'], capture_output=True, text=True))"
)
ENVIRONMENT = (
    "import os, subprocess\nprint(dict(os.environ))\n"
    "print(subprocess.run(['sh', '-c', 'env'], capture_output=True, text=True).stdout)"
)
FETCH = "import urllib.request\nprint(urllib.request.urlopen('http://127.0.0.1:{port}/{path}', timeout=20).read())"


def server_command(workspace: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "ivralo_kernel", "mcp", "--workspace", str(workspace), *extra]


def server_env() -> dict[str, str]:
    # The person's environment holds a credential: the kernel must never see it.
    return {**os.environ, "IVRALO_TEST_API_KEY": SECRET}


def servers_of(workspace: Path) -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmdline = child.cmdline()
            if "mcp" in cmdline and str(workspace) in cmdline and "ivralo_kernel" in cmdline:
                found.append(child)
    return found


def tree_pids(root: psutil.Process) -> list[int]:
    """Every process under the server (the kernels' supervisors, bwrap, kernels), by pid."""
    with contextlib.suppress(psutil.Error):
        return [p.pid for p in root.children(recursive=True)]
    return []


def kernels_under(root: psutil.Process) -> list[int]:
    pids = []
    for p in root.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "ivralo_kernel.kernel" in p.cmdline():
                pids.append(p.pid)
    return pids


class Person:
    """The person at the client: answers each egress form with ``answer``, and remembers it."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.asked: list[dict[str, Any]] = []

    async def __call__(self, ctx: Any, params: Any) -> ElicitResult:
        self.asked.append({"message": params.message, "schema": params.requested_schema})
        return ElicitResult(action="accept", content={"answer": self.answer})


@contextlib.asynccontextmanager
async def stdio_client(
    workspace: Path, mode: str, *extra: str, person: Person | None = None, env: dict[str, str] | None = None
) -> AsyncIterator[tuple[Client, list[int]]]:
    """A Client over stdio; yields it and a list the test fills with the tree's pids, which are all
    checked gone once the client has left (stdin's end)."""
    command = server_command(workspace, *extra)
    params = StdioServerParameters(command=command[0], args=command[1:], env=env or server_env(), cwd=str(workspace))
    seen: list[int] = []
    async with Client(params, mode=mode, elicitation_callback=person, read_timeout_seconds=90) as client:  # type: ignore[arg-type]
        yield client, seen
        for server in servers_of(workspace):
            seen += tree_pids(server)
    wait_until(lambda: all(gone(pid) for pid in seen), 30, f"the kernel trees {seen} to end with the server")


def text_of(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def the_server(workspace: Path) -> psutil.Process:
    found = servers_of(workspace)
    assert len(found) == 1, found
    return found[0]


@contextlib.contextmanager
def api_endpoint() -> Iterator[tuple[int, list[str]]]:
    """A loopback API that answers 200 only with the host's key as a bearer token (401 without it);
    records each request as "path key-or-none"."""
    hits: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            authorized = self.headers.get("Authorization") == f"Bearer {SECRET}"
            hits.append(f"{self.path} {'with the key' if authorized else 'without it'}")
            body = json.dumps({"authorized": authorized}).encode()
            self.send_response(200 if authorized else 401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(httpd.server_address[1]), hits
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def config_home_with_api(home: Path, port: int) -> dict[str, str]:
    """A private config home whose apis.json has ``test.search`` (the host's key as a bearer token),
    and the server's environment pointing at it."""
    home.mkdir()
    search = {"url": f"http://127.0.0.1:{port}/search", "credential": "IVRALO_TEST_API_KEY", "auth": {"kind": "bearer"}}
    search["params"] = {"q": {"type": "string", "required": True}}
    (home / "apis.json").write_text(json.dumps({"operations": {"test.search": search}}), encoding="utf-8")
    return {**server_env(), "IVRALO_CONFIG_HOME": str(home)}


API_CALL = "r = ivralo.call('test.search', q='cats')\nprint(r.status, r.body)"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", MODES)
async def test_persistence_an_error_a_plot_and_no_process_left(workspace: Path, mode: str) -> None:
    async with stdio_client(workspace, mode) as (client, seen):
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(tools) >= {"run_python", "interrupt", "restart", "get_var", "set_var", "list_vars"}
        assert set(tools) >= {"snapshot", "history", "restore", "run_tests"}
        assert all(tool.description and len(tool.description) > 40 for tool in tools.values())

        first = await client.call_tool("run_python", {"code": "x = 41\nopen('made.txt', 'w').write('by the cell')"})
        assert not first.is_error, text_of(first)
        second = await client.call_tool("run_python", {"code": "x + 1"})
        assert text_of(second) == "42\n" and second.structured_content is not None
        assert second.structured_content["status"] == "ok" and second.structured_content["result"] == "42\n"
        assert (workspace / "made.txt").read_text() == "by the cell"  # on disk, where the person looks

        failed = await client.call_tool("run_python", {"code": "def f():\n    return 1 / 0\nf()"})
        assert failed.is_error
        assert "ZeroDivisionError" in text_of(failed) and "Traceback" in text_of(failed)
        assert failed.structured_content is not None and failed.structured_content["status"] == "error"

        plot = await client.call_tool("run_python", {"code": PLOT})
        images = [block for block in plot.content if block.type == "image"]
        assert len(images) == 1 and images[0].mime_type == "image/png", plot.content
        assert base64.b64decode(images[0].data).startswith(b"\x89PNG\r\n\x1a\n")

        assert (await client.call_tool("get_var", {"name": "x"})).structured_content == {"name": "x", "value": 41}
        await client.call_tool("set_var", {"name": "y", "value": {"a": [1, 2]}})
        got = await client.call_tool("run_python", {"code": "y['a'][1] + x"})
        assert text_of(got) == "43\n"
        listed = (await client.call_tool("list_vars", {})).structured_content
        assert listed is not None and {"x", "y"} <= set(listed["names"])
        missing = await client.call_tool("get_var", {"name": "nope"})
        assert missing.is_error and "nope" in text_of(missing)
        assert kernels_under(the_server(workspace)), "a kernel runs under the server"
    assert seen, "the server had a kernel tree to end"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("answer", ["yes", "no", None])
async def test_the_person_answers_through_elicitation(workspace: Path, mode: str, answer: str | None) -> None:
    """A yes lets one request through; a no, or a client without elicitation, lets none. The form
    has one property, ``answer``; a fresh folder offers no "always"; no grant is written."""
    person = Person(answer) if answer else None
    with counting_http() as (port, hits):
        async with stdio_client(workspace, mode, person=person) as (client, _):
            result = await client.call_tool("run_python", {"code": FETCH.format(port=port, path="asked")})
            await client.call_tool("run_python", {"code": CURL.format(port=port)})
    if answer == "yes":
        assert not result.is_error, text_of(result)
        assert "hello from the host" in text_of(result)
        assert hits[0] == "/asked"
    else:
        assert result.is_error and "403" in text_of(result), text_of(result)
        assert hits == [], "a no (or nobody to ask) lets nothing through"
    if person is not None:
        assert person.asked, "the person was asked"
        schema = person.asked[0]["schema"]
        assert list(schema["properties"]) == ["answer"]
        assert schema["properties"]["answer"]["enum"] == ["yes", "no"]  # a fresh folder: no "always"
        assert f"port {port}" in person.asked[0]["message"]
    assert not (workspace / ".ivralo" / "permissions.json").exists()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", MODES)
async def test_both_deadline_outcomes_with_progress(workspace: Path, mode: str) -> None:
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append(value)

    # The settings model applies as for `run`: the flag, or the same setting as --IvraloAgent.NAME=.
    deadline = ("--deadline-ms", "2500") if mode == "legacy" else ("--IvraloAgent.deadline_ms=2500",)
    async with stdio_client(workspace, mode, *deadline) as (client, _):
        await client.call_tool("run_python", {"code": "kept = 7"})
        started = time.monotonic()
        slow = await client.call_tool(
            "run_python", {"code": "import time\ntime.sleep(60)"}, progress_callback=on_progress
        )
        assert time.monotonic() - started < 30
        assert slow.is_error and slow.structured_content is not None
        assert slow.structured_content["error"] == names.INTERRUPTED_TEXT.format(deadline_ms=2500)
        assert progress, "progress notifications came while the cell ran"
        assert text_of(await client.call_tool("run_python", {"code": "kept"})) == "7\n"  # the namespace kept

        kernel = kernels_under(the_server(workspace))
        stubborn = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
        killed = await client.call_tool("run_python", {"code": stubborn})
        assert killed.is_error and killed.structured_content is not None
        error = killed.structured_content["error"]
        assert error.startswith("REPL worker terminated (timeout") and "were lost: kept, time." in error, error
        wait_until(lambda: all(gone(pid) for pid in kernel), 15, "the killed kernel to be gone")
        again = await client.call_tool("run_python", {"code": "'kept' in globals()"})
        assert text_of(again) == "False\n"  # a fresh kernel


RUNNING = "import pathlib, time\npathlib.Path({name!r}).touch()\ntime.sleep(120)"


async def _running(client: Client, workspace: Path, name: str) -> asyncio.Task[Any]:
    """A call whose cell is running: the cell itself says so (a file), not the server's first
    progress, which comes after a second whether the kernel has started yet or not."""
    call = asyncio.ensure_future(client.call_tool("run_python", {"code": RUNNING.format(name=name)}))
    await wait_until_async(lambda: (workspace / name).exists() or call.done(), 60, "the cell to start")
    assert not call.done(), call.result()
    return call


async def _interrupt_then_cancel(client: Client, workspace: Path, tag: str) -> None:
    await client.call_tool("run_python", {"code": "z = 1"})
    kernel = kernels_under(the_server(workspace))
    call = await _running(client, workspace, f"interrupted-{tag}")
    stopped = await client.call_tool("interrupt", {})
    assert stopped.structured_content is not None and stopped.structured_content["interrupted"] is True
    assert "were lost: z." in stopped.structured_content["message"]
    result = await asyncio.wait_for(call, 30)
    assert result.is_error and "interrupted: stopped at once by the user" in text_of(result)
    wait_until(lambda: all(gone(pid) for pid in kernel), 15, "the interrupted kernel to be gone")

    # The client's cancellation interrupts the call too: the kernel's tree ends.
    call = await _running(client, workspace, f"cancelled-{tag}")
    kernel = kernels_under(the_server(workspace))
    assert kernel
    call.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await call
    # On the loop: the client's cancellation (a notification; over HTTP at 2026, the call's own
    # request closed) is sent by its tasks.
    await wait_until_async(lambda: all(gone(pid) for pid in kernel), 30, "the cancelled call's kernel to be gone")
    after = await client.call_tool("run_python", {"code": "1 + 1"})
    assert text_of(after) == "2\n", "two losses are two (no restart-loop note)"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("over", ["stdio legacy", "stdio auto", "http"])
async def test_an_interrupt_during_a_call_and_a_cancelled_call(workspace: Path, over: str) -> None:
    """Over HTTP one server takes both modes in turn: the legacy client's cancellation is a
    notification, the 2026 client's is its request's connection closed."""
    if over.startswith("stdio"):
        async with stdio_client(workspace, over.split()[1]) as (client, _):
            await _interrupt_then_cancel(client, workspace, over.split()[1])
        return
    with http_server(workspace) as (proc, url):
        for mode in MODES:
            async with Client(url, mode=mode) as client:
                await _interrupt_then_cancel(client, workspace, mode)
        tree = tree_pids(psutil.Process(proc.pid))
    wait_until(lambda: all(gone(pid) for pid in tree), 30, f"the HTTP server's tree {tree} to end with it")


@pytest.mark.timeout(180)
async def test_no_host_credential_reaches_the_kernel(workspace: Path, tmp_path: Path) -> None:
    """And without --grant, the host's API is refused before it is reached (its hits: none)."""
    with api_endpoint() as (api_port, api_hits):
        env = config_home_with_api(tmp_path / "config-home", api_port)
        async with stdio_client(workspace, "legacy", env=env) as (client, _):
            refused = await client.call_tool("run_python", {"code": API_CALL})
            assert refused.is_error and 'this kernel has no "test" grant' in text_of(refused), text_of(refused)
            assert api_hits == []
            await _no_credential_in_the_tree(client, workspace)


async def _no_credential_in_the_tree(client: Client, workspace: Path) -> None:
    """The host holds the key (its environ); nothing the kernel prints or any process of its tree does."""
    shown = await client.call_tool("run_python", {"code": ENVIRONMENT})
    assert SECRET not in text_of(shown)
    server = the_server(workspace)
    assert SECRET.encode() in Path(f"/proc/{server.pid}/environ").read_bytes()  # the host has it
    for pid in tree_pids(server):  # no process of the kernel's tree does (read from outside)
        with contextlib.suppress(FileNotFoundError, ProcessLookupError, PermissionError):
            assert SECRET.encode() not in Path(f"/proc/{pid}/environ").read_bytes(), pid
    assert SECRET not in json.dumps(shown.structured_content)


@pytest.mark.timeout(240)
async def test_a_grant_a_project_and_always_in_a_trusted_folder(tmp_path: Path) -> None:
    """One server, ``--project P --grant test``, in the trusted project folder: the kernel runs the
    project's interpreter (the process table says so); the host's key reaches the API through the
    broker and never the kernel; "always" is offered, recorded by the host in
    .ivralo/permissions.json, and the same host:port is not asked about again."""
    project = tmp_path / "proj"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(project / ".venv")], check=True, timeout=60)
    venv_python = project / ".venv" / "bin" / "python"
    site = next((project / ".venv" / "lib").glob("python3*/site-packages"))
    (site / "projectlib.py").write_text("WHERE = 'the project'\n")
    person = Person("always")
    with api_endpoint() as (api_port, api_hits), counting_http() as (port, hits):
        env = config_home_with_api(tmp_path / "config-home", api_port)
        set_trust(str(project), True, env)
        async with stdio_client(
            project, "auto", "--project", str(project), "--grant", "test", person=person, env=env
        ) as (
            client,
            _,
        ):
            where = await client.call_tool(
                "run_python", {"code": "import sys, projectlib\nprint(sys.executable, projectlib.WHERE)"}
            )
            assert text_of(where) == f"{venv_python} the project\n", text_of(where)
            kernel = kernels_under(the_server(project))
            assert [psutil.Process(pid).cmdline()[0] for pid in kernel] == [str(venv_python)]

            called = await client.call_tool("run_python", {"code": API_CALL})
            assert text_of(called).startswith("200 {'authorized': True}\n"), text_of(called)
            assert api_hits == ["/search?q=cats with the key"]
            assert SECRET not in text_of(called)
            await _no_credential_in_the_tree(client, project)

            first = await client.call_tool("run_python", {"code": FETCH.format(port=port, path="first")})
            assert "hello from the host" in text_of(first), text_of(first)
            assert len(person.asked) == 1
            assert person.asked[0]["schema"]["properties"]["answer"]["enum"] == ["yes", "always", "no"]
            saved = json.loads((project / ".ivralo" / "permissions.json").read_text())
            assert saved == {"hosts": {"allow": [f"127.0.0.1:{port}"]}}  # on disk, that port alone
            wrote = await client.call_tool("run_python", {"code": "open('.ivralo/permissions.json', 'a').write('x')"})
            assert wrote.is_error, "the kernel cannot write it: the host did"
            again = await client.call_tool("run_python", {"code": FETCH.format(port=port, path="again")})
            assert "hello from the host" in text_of(again), text_of(again)
    assert len(person.asked) == 1, "the same host and port is not asked about again"
    assert hits == ["/first", "/again"]
    assert json.loads((project / ".ivralo" / "permissions.json").read_text()) == saved


# ---- the process table: stdin's end and SIGTERM, by hand over stdio ----------------------------


def _send(proc: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(message).encode() + b"\n")
    proc.stdin.flush()


def _read_until(proc: subprocess.Popen[bytes], wanted: Any) -> dict[str, Any]:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        assert line, "the server closed its stdout"
        message: dict[str, Any] = json.loads(line)
        if wanted(message):
            return message


def _legacy_handshake(proc: subprocess.Popen[bytes]) -> None:
    init = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    _send(proc, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
    _read_until(proc, lambda m: m.get("id") == 1)
    _send(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})


def _call(proc: subprocess.Popen[bytes], call_id: int, code: str) -> None:
    params = {"name": "run_python", "arguments": {"code": code}, "_meta": {"progressToken": call_id}}
    _send(proc, {"jsonrpc": "2.0", "id": call_id, "method": "tools/call", "params": params})


@pytest.mark.timeout(180)
@pytest.mark.parametrize("ending", ["stdin EOF", "SIGTERM"])
async def test_nothing_outlives_the_server(workspace: Path, ending: str) -> None:
    proc = subprocess.Popen(
        server_command(workspace), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=server_env(), cwd=workspace
    )
    try:
        _legacy_handshake(proc)
        _call(proc, 2, "x = 1")
        reply = _read_until(proc, lambda m: m.get("id") == 2)
        assert reply["result"]["isError"] is False
        _call(proc, 3, "import time\ntime.sleep(120)")  # in flight when the server is told to end
        _read_until(proc, lambda m: m.get("method") == "notifications/progress")
        tree = tree_pids(psutil.Process(proc.pid))
        assert kernels_under(psutil.Process(proc.pid))
        if ending == "SIGTERM":
            proc.send_signal(signal.SIGTERM)
        else:
            assert proc.stdin is not None
            proc.stdin.close()
        proc.wait(timeout=30)  # on its own: nobody else ends it here
        wait_until(lambda: all(gone(pid) for pid in tree), 15, f"every process of {tree} to be gone")
    finally:
        kill_tree(proc.pid)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


# ---- streamable HTTP on 127.0.0.1 -----------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def http_server(workspace: Path, *extra: str) -> Any:
    port = _free_port()
    proc = subprocess.Popen(
        server_command(workspace, "--transport", "http", "--port", str(port), *extra),
        stderr=subprocess.PIPE,
        env=server_env(),
        cwd=workspace,
    )
    drain: threading.Thread | None = None
    try:
        assert proc.stderr is not None
        said = []
        while f"http://127.0.0.1:{port}/mcp" not in "".join(said):  # the announcement: it listens now
            line = proc.stderr.readline().decode()
            assert line and len(said) < 50, said
            said.append(line)
        # The rest of its stderr is read on, so that the pipe never fills.
        drain = threading.Thread(target=proc.stderr.read, daemon=True)
        drain.start()
        yield proc, f"http://127.0.0.1:{port}/mcp"
    finally:
        kill_tree(proc.pid)
        proc.wait(timeout=10)
        if drain is not None:
            drain.join(timeout=10)  # the pipe's end came with the process's
        if proc.stderr is not None:
            proc.stderr.close()


@pytest.mark.timeout(240)
async def test_over_http_a_client_leaving_ends_its_kernel_and_sigterm_ends_the_rest(workspace: Path) -> None:
    with counting_http() as (port, hits), http_server(workspace) as (proc, url):
        listening = [c.laddr for c in psutil.Process(proc.pid).net_connections() if c.status == psutil.CONN_LISTEN]
        assert [addr.ip for addr in listening] == ["127.0.0.1"], listening  # this machine only, by default

        async with Client(url, mode="legacy", elicitation_callback=Person("yes")) as client:
            await client.call_tool("run_python", {"code": "x = 20"})
            assert text_of(await client.call_tool("run_python", {"code": "x * 2"})) == "40\n"
            fetched = await client.call_tool("run_python", {"code": FETCH.format(port=port, path="http")})
            assert "hello from the host" in text_of(fetched) and hits == ["/http"]
            first_tree = tree_pids(psutil.Process(proc.pid))
            assert first_tree
        # The client left (its session's DELETE): its kernel ends, the server stays.
        wait_until(lambda: all(gone(pid) for pid in first_tree), 30, "the departed client's kernel to end")
        assert proc.poll() is None

        person = Person("no")
        async with Client(url, mode="auto", elicitation_callback=person) as client:
            refused = await client.call_tool("run_python", {"code": FETCH.format(port=port, path="refused")})
            assert refused.is_error and "403" in text_of(refused) and person.asked
            assert hits == ["/http"]
            await client.call_tool("run_python", {"code": "y = 2"})
            tree = tree_pids(psutil.Process(proc.pid))
            assert kernels_under(psutil.Process(proc.pid))
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        wait_until(lambda: all(gone(pid) for pid in tree), 15, f"every process of {tree} to be gone")


@pytest.mark.timeout(60)
def test_without_the_sdk_the_command_says_how_to_install_it(workspace: Path) -> None:
    hide = "import sys; sys.modules['mcp'] = None; from ivralo_kernel.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", hide, "mcp", "--workspace", str(workspace)],
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 2
    assert "pip install 'ivralo-kernel[mcp]'" in done.stderr
    assert done.stdout == ""  # stdout is the protocol's channel


@pytest.mark.timeout(60)
def test_a_setting_that_does_not_exist_is_refused_before_any_client(workspace: Path) -> None:
    done = subprocess.run(
        [*server_command(workspace), "--IvraloAgent.deadline_msec=5"],
        capture_output=True,
        text=True,
        timeout=50,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert "deadline_msec" in done.stderr and "Did you mean deadline_ms" in done.stderr, done.stderr


@pytest.mark.timeout(240)
async def test_history_restore_run_tests_and_restart(workspace: Path) -> None:
    (workspace / "notes.txt").write_text("the person's")
    (workspace / "test_small.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    async with stdio_client(workspace, "legacy") as (client, _):
        changed = await client.call_tool("run_python", {"code": "open('notes.txt', 'w').write(\"the cell's\")"})
        assert not changed.is_error and (workspace / "notes.txt").read_text() == "the cell's"
        listed = (await client.call_tool("history", {"path": "notes.txt"})).structured_content
        assert listed is not None and listed["entries"] and listed["entries"][0]["path"] == "notes.txt"
        restored = await client.call_tool("restore", {"id": listed["entries"][0]["id"]})
        assert not restored.is_error, text_of(restored)
        assert (workspace / "notes.txt").read_text() == "the person's"  # on disk
        bad = await client.call_tool("restore", {"id": "no-such-copy"})
        assert bad.is_error and "no-such-copy" in text_of(bad)

        report = (await client.call_tool("run_tests", {"path": "test_small.py"})).structured_content
        assert report is not None and report["passed"] == 1 and report["failed"] == 0, report

        await client.call_tool("run_python", {"code": "w = 3"})
        kernel = kernels_under(the_server(workspace))
        restarted = (await client.call_tool("restart", {})).structured_content
        assert restarted is not None and "were lost: w." in restarted["message"], restarted
        assert restarted["message"].endswith("A fresh kernel is ready.")
        fresh = [pid for pid in kernels_under(the_server(workspace)) if pid not in kernel]
        assert fresh, "restart returned with the fresh kernel already running"
        wait_until(lambda: all(gone(pid) for pid in kernel), 15, "the restarted kernel's tree to be gone")
        assert text_of(await client.call_tool("run_python", {"code": "'w' in globals()"})) == "False\n"
        assert kernels_under(the_server(workspace)) == fresh, "the call ran in the kernel restart made ready"


CLIENT_THAT_DIES = """
import asyncio, sys
from mcp import Client

async def main():
    async with Client(sys.argv[1], mode=sys.argv[2]) as client:
        await client.call_tool("run_python", {"code": sys.argv[3]})

asyncio.run(main())
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", MODES)
async def test_an_http_client_killed_during_a_call_leaves_no_kernel(workspace: Path, mode: str) -> None:
    with http_server(workspace) as (proc, url):
        running = RUNNING.format(name="started")
        client = subprocess.Popen([sys.executable, "-c", CLIENT_THAT_DIES, url, mode, running], stdout=subprocess.PIPE)
        try:
            # The cell itself says it runs (the server's first progress comes whether the kernel has started or not).
            wait_until(lambda: (workspace / "started").exists() or client.poll() is not None, 60, "the cell to start")
            assert client.poll() is None
            tree = tree_pids(psutil.Process(proc.pid))
            assert kernels_under(psutil.Process(proc.pid))
            client.kill()  # no DELETE, no cancel: its connection just drops
            client.wait(timeout=10)
            wait_until(lambda: all(gone(pid) for pid in tree), 60, f"the dead client's kernel tree {tree} to end")
            assert proc.poll() is None
        finally:
            kill_tree(client.pid)
            if client.stdout is not None:
                client.stdout.close()


@pytest.mark.timeout(180)
async def test_the_readonly_role_refuses_every_write(workspace: Path) -> None:
    async with stdio_client(workspace, "legacy", "--role", "readonly") as (client, _):
        wrote = await client.call_tool("run_python", {"code": "open('made.txt', 'w').write('x')"})
        shell = await client.call_tool(
            "run_python", {"code": "import subprocess\nsubprocess.run(['sh', '-c', 'echo x > by_sh.txt'])"}
        )
    assert wrote.is_error, text_of(wrote)
    assert not (workspace / "made.txt").exists() and not (workspace / "by_sh.txt").exists(), text_of(shell)
