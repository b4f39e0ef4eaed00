"""The fallback's network and Jupyter links (no sandbox can be built, or ``sandbox="off"``).

The kernel's own Jupyter sockets are ``ipc`` files in its private run folder, relayed by the host as
in the sandbox, so the host asks the person on the relay's stdin again. The supervisor relays a
loopback port to the host's egress proxy, and Landlock's TCP rule lets the kernel's tree connect to
that port only: curl, a Python child and ctypes reach a loopback server only through the proxy,
after a yes. Judged from outside the kernel: the loopback server's hits and files on disk.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_frontend_features as frontend
import test_vscode_launch as vscode
from conftest import FALLBACK_KERNEL
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager
from kernel_helpers import execute
from sandbox_cases import counting_http, sh
from test_egress_answer import as_a_person, untrusted_question
from test_vscode_launch import raw_launch, tree_of

from ivralo_kernel.guards import landlock

pytestmark = pytest.mark.timeout(180)
TCP_RULE = landlock.abi() >= 4

DIRECT = r"""
import ctypes, json, subprocess, sys
port = {port}
out = {{}}
out["sh"] = subprocess.run(["sh", "-c", f"curl -s --noproxy '*' -m 5 http://127.0.0.1:{{port}}/sh; echo rc=$?"],
                           capture_output=True, text=True).stdout
child = (
    f"import socket\ntry:\n socket."
    f"create_connection(('127.0.0.1', {{port}}), 5).sendall(b'GET /child HTTP/1.0\\r\\n\\r\\n')"
    "\n print('connected')\nexcept OSError as e:\n print('refused', e.errno)"
)
out["child"] = subprocess.run([sys.executable, "-I", "-c", child], capture_output=True, text=True).stdout
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.socket(2, 1, 0)
addr = (ctypes.c_ubyte * 16)(2, 0, port >> 8, port & 255, 127, 0, 0, 1)
rc = libc.connect(fd, addr, 16)
out["ctypes"] = (rc, ctypes.get_errno())
if rc == 0:
    libc.send(fd, b"GET /ctypes HTTP/1.0\r\n\r\n", 24, 0)
print("RESULT", json.dumps(out))
"""


@pytest.fixture
def fallback(workspace: Path) -> Iterator[BlockingKernelClient]:
    manager = KernelManager(kernel_name=FALLBACK_KERNEL)
    manager.start_kernel(cwd=str(workspace))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        yield client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def result(stdout: str) -> dict[str, object]:
    line = next(line for line in stdout.splitlines() if line.startswith("RESULT "))
    return dict(json.loads(line.removeprefix("RESULT ")))


@pytest.mark.skipif(not TCP_RULE, reason="Landlock's TCP rule needs ABI 4 (Linux >= 6.7)")
def test_a_direct_connect_from_sh_a_python_child_or_ctypes_reaches_no_port(fallback: BlockingKernelClient) -> None:
    with counting_http() as (port, hits):
        ran = execute(fallback, DIRECT.format(port=port), timeout=60)
        assert hits == [], ran.stdout + ran.stderr
    out = result(ran.stdout)
    assert out["sh"] == "rc=7\n" and out["child"].startswith("refused 13"), out  # type: ignore[union-attr]
    assert out["ctypes"] == [-1, 13], out


PROXIED = """
import subprocess, urllib.request
print(urllib.request.urlopen('http://localhost:{port}/python', timeout=30).status)
print(subprocess.run(["sh", "-c", "curl -s -m 30 http://localhost:{port}/sh"], capture_output=True, text=True).stdout)
"""


@pytest.mark.parametrize("typed", ["yes", "no"])
def test_the_person_is_asked_on_the_relay_and_the_proxy_is_the_only_way(
    fallback: BlockingKernelClient, workspace: Path, typed: str
) -> None:
    """The newcomer's path: a fresh folder, nothing allowed. The host asks at the cell's prompt (on
    the relay's stdin, which the kernel neither reads nor writes); yes: Python and curl get through
    the proxy (one question); no: nothing does."""
    with counting_http() as (port, hits):
        prompts, stdout = as_a_person(fallback, PROXIED.format(port=port), lambda _p, _s: typed)
        got = sorted(hits)
    assert prompts == [untrusted_question(port, workspace)], stdout
    assert got == (["/python", "/sh"] if typed == "yes" else []), stdout
    assert not (workspace / ".ivralo" / "permissions.json").exists()


def test_a_raw_launch_without_the_sandbox_goes_through_the_relay_and_the_proxy(workspace: Path, tmp_path: Path) -> None:
    """VS Code's raw launch in the fallback: the raw-launch host relays the client's TCP ports to the
    kernel's ipc sockets and runs the proxy; the allow list alone decides (a fallback kernel could
    write permissions.json itself, so the host reads it as it was at the start), and a direct
    connect fails."""
    with counting_http() as (allowed, hits), counting_http() as (other, other_hits):
        (workspace / ".ivralo").mkdir(exist_ok=True)
        (workspace / ".ivralo" / "permissions.json").write_text(
            json.dumps({"hosts": {"allow": [f"127.0.0.1:{allowed}"]}})
        )
        with raw_launch(workspace, tmp_path, kernel_name=FALLBACK_KERNEL) as raw:
            # From outside: the kernel runs on its own connection file, abstract ipc sockets (no file).
            given = [cmd[cmd.index("-f") + 1] for cmd in tree_of(raw.proc.pid) if "-f" in cmd]
            inner = json.loads(Path(given[-1]).read_text())
            assert inner["transport"] == "ipc" and inner["ip"].startswith("@ivralo-"), inner
            assert Path(given[-1]).parent.stat().st_mode & 0o777 == 0o700
            curl = "curl -sS -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{}/{}"
            assert sh(raw.client, curl.format(other, "other")).startswith("403")
            assert sh(raw.client, curl.format(allowed, "raw")).startswith("200")
            if TCP_RULE:
                said = sh(raw.client, f"curl -sS --noproxy '*' -m 5 http://127.0.0.1:{allowed}/direct; echo rc=$?")
                assert "rc=7" in said, said
        assert hits == ["/raw"] and other_hits == []


def test_the_debugger_and_a_forked_childs_output_still_work_under_the_tcp_rule(fallback: BlockingKernelClient) -> None:
    """Their loopback ports were held before Landlock's rule and are in it (kernel.own_ports)."""
    frontend.test_a_forked_child_prints_into_the_cell(fallback)
    frontend.test_debugger_under_the_host_stops_at_a_breakpoint(fallback)


def test_a_raw_launch_without_the_sandbox_debugs_a_cell(workspace: Path, tmp_path: Path) -> None:
    with raw_launch(workspace, tmp_path, kernel_name=FALLBACK_KERNEL) as raw:
        vscode.test_debug_cell_stops_at_a_breakpoint(raw)


@pytest.mark.parametrize("decoy", [True, False], ids=["a-kernels-port", "control"])
def test_another_kernels_channel_is_never_reached_through_the_proxy_even_after_a_yes(
    fallback: BlockingKernelClient, workspace: Path, decoy: bool
) -> None:
    """A kernel that read another's connection file (the runtime folder is readable outside the
    sandbox) could reach its TCP ports through the proxy after a person's yes, and run code there
    with its key: the host refuses every port of the runtime folder's connection files. Judged by
    the server that stands for the other kernel's shell port: no hit (the control, without the
    file: one)."""
    from jupyter_core.paths import jupyter_runtime_dir

    with counting_http() as (port, hits):
        other = Path(jupyter_runtime_dir()) / "kernel-another.json"
        if decoy:
            other.write_text(json.dumps({"shell_port": port, "ip": "127.0.0.1", "transport": "tcp", "key": "k"}))
        try:
            code = f"import urllib.request\nprint(urllib.request.urlopen('http://localhost:{port}/other').status)"
            prompts, stdout = as_a_person(fallback, code, lambda _p, _s: "yes")
        finally:
            other.unlink(missing_ok=True)
        got = list(hits)
    assert got == ([] if decoy else ["/other"]), stdout
    assert prompts == [untrusted_question(port, workspace)], stdout  # the person did say yes
    if decoy:
        assert "it is a Jupyter kernel's channel on this machine" in stdout, stdout
