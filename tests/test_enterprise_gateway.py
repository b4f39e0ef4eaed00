"""An ivralo kernel started by Jupyter Enterprise Gateway through its remote handshake.

Enterprise Gateway (EG) 3.3 pins jupyter_client<7, so it runs from its own venv (``.venv-eg``,
made by ``make test``) and launches ivralo's kernel from this checkout's venv, as a Kubernetes
deployment would launch ivralo's image. Its ``DistributedProcessProxy`` on 127.0.0.1 runs the same
remote handshake as its Kubernetes proxy (response address, encrypted connection info, signals over
the launcher's comm port) without ssh or a cluster, so ``deploy/enterprise-gateway/launch_ivralo.py``
is tested here against EG's real code. What a pod adds (its image, its security context) is not run
on this machine; docs/remote.md says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
import websocket
from conftest import gone, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parent.parent
EG_PYTHON = ROOT / ".venv-eg" / "bin" / "python"
LAUNCHER = ROOT / "deploy" / "enterprise-gateway" / "launch_ivralo.py"
SPEC_NAME = "ivralo-remote"
TOKEN = uuid.uuid4().hex
HEADERS = {"Authorization": f"token {TOKEN}"}


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def remote_spec(prefix: Path) -> None:
    """The ivralo_distributed kernelspec from deploy/, pointed at this checkout and at loopback."""
    shipped = json.loads((LAUNCHER.parent / "kernelspecs" / "ivralo_distributed" / "kernel.json").read_text())
    spec = {
        **shipped,
        "argv": [str(EG_PYTHON), str(LAUNCHER), *shipped["argv"][2:]],
        "env": {
            **shipped["env"],
            "IVRALO_DEADLINE_MS": "3000",
            "IVRALO_KERNEL_PYTHON": sys.executable,
            "IVRALO_KERNEL_IP": "127.0.0.1",
        },
    }
    spec["metadata"]["process_proxy"]["config"] = {"remote_hosts": "127.0.0.1"}
    folder = prefix / "share" / "jupyter" / "kernels" / SPEC_NAME
    folder.mkdir(parents=True)
    (folder / "kernel.json").write_text(json.dumps(spec))


@pytest.fixture
def gateway(tmp_path: Path, workspace: Path) -> Iterator[tuple[str, int]]:
    """Enterprise Gateway on loopback: (its URL, its pid)."""
    if not EG_PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{EG_PYTHON} is missing: `make test` creates it (make .venv-eg/.installed)")
        pytest.skip(f"{EG_PYTHON} is missing: run `make .venv-eg/.installed`")
    remote_spec(tmp_path / "prefix")
    port = free_port()
    env = {
        **os.environ,
        "JUPYTER_PATH": str(tmp_path / "prefix" / "share" / "jupyter"),
        "EG_RESPONSE_IP": "127.0.0.1",  # EG's response listener on loopback, not the first public address
    }
    log = (tmp_path / "eg.log").open("w")
    eg = subprocess.Popen(
        [
            str(EG_PYTHON),
            "-m",
            "enterprise_gateway",
            "--EnterpriseGatewayApp.ip=127.0.0.1",
            f"--EnterpriseGatewayApp.port={port}",
            "--EnterpriseGatewayApp.port_retries=0",
            f"--EnterpriseGatewayApp.auth_token={TOKEN}",
            "--EnterpriseGatewayApp.list_kernels=True",
        ],
        env=env,
        cwd=workspace,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return requests.get(f"{url}/api", headers=HEADERS, timeout=1).status_code == 200
        except requests.ConnectionError:
            assert eg.poll() is None, (tmp_path / "eg.log").read_text()
            return False

    try:
        wait_until(up, 30, "Enterprise Gateway's /api")
        yield url, eg.pid
    finally:
        os.killpg(eg.pid, signal.SIGTERM)
        try:
            eg.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(eg.pid, signal.SIGKILL)
            eg.wait(10)
        log.close()


class Channels:
    """The kernel's channels over EG's websocket (Jupyter's JSON websocket protocol)."""

    def __init__(self, url: str, kernel_id: str) -> None:
        ws_url = url.replace("http://", "ws://") + f"/api/kernels/{kernel_id}/channels"
        self.ws = websocket.create_connection(ws_url, header=[f"Authorization: token {TOKEN}"], timeout=30)
        self.session = uuid.uuid4().hex

    def send(self, code: str) -> str:
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "test", "session": self.session}
        header |= {"version": "5.3", "date": datetime.now(UTC).isoformat()}
        content = {"code": code, "silent": False, "store_history": True, "user_expressions": {}}
        content |= {"allow_stdin": False, "stop_on_error": True}
        message = {"header": header, "parent_header": {}, "metadata": {}, "content": content}
        self.ws.send(json.dumps(message | {"channel": "shell", "buffers": []}))
        return msg_id

    def next_of(self, msg_id: str, timeout: float) -> dict[str, Any]:
        """The next message whose parent is ``msg_id``, within ``timeout`` seconds in all (the
        server's websocket pings would otherwise restart a per-read timeout)."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            self.ws.settimeout(left)
            incoming: dict[str, Any] = json.loads(self.ws.recv())
            if incoming["parent_header"].get("msg_id") == msg_id:
                return incoming
        raise AssertionError(f"no message for {msg_id} within {timeout} s")

    def finish(self, msg_id: str, timeout: float = 30) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The execute_reply's content and the cell's IOPub outputs, once the kernel is idle again.
        The reply (shell) and the idle status (IOPub) come on different channels, in either order."""
        deadline = time.monotonic() + timeout
        reply: dict[str, Any] | None = None
        idle = False
        outputs = []
        while reply is None or not idle:
            incoming = self.next_of(msg_id, max(0.01, deadline - time.monotonic()))
            kind = incoming["msg_type"]
            if kind == "execute_reply":
                reply = incoming["content"]
            elif kind in ("stream", "execute_result", "error"):
                outputs.append(incoming["content"])
            elif kind == "status" and incoming["content"]["execution_state"] == "idle":
                idle = True
        return reply, outputs

    def execute(self, code: str, timeout: float = 30) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        return self.finish(self.send(code), timeout)

    def close(self) -> None:
        self.ws.close()


def text_of(outputs: list[dict[str, Any]]) -> str:
    parts = []
    for output in outputs:
        parts.append(output.get("text") or output.get("data", {}).get("text/plain") or "")
        parts.extend(output.get("traceback", []))
    return "\n".join(parts)


def launched_tree(gateway_pid: int) -> tuple[int, int]:
    """The launcher (the gateway's child) and the kernel process under it, by this machine's pids."""
    for process in psutil.Process(gateway_pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):  # a process that just ended
            if str(LAUNCHER) in process.cmdline():
                for child in process.children(recursive=True):
                    with contextlib.suppress(psutil.Error):
                        if "ivralo_kernel.kernel" in child.cmdline():
                            return process.pid, child.pid
    raise AssertionError("no launcher with a kernel under Enterprise Gateway")


def test_enterprise_gateway_runs_ivralo_through_its_remote_handshake(gateway: tuple[str, int], workspace: Path) -> None:
    url, gateway_pid = gateway
    started = requests.post(
        f"{url}/api/kernels",
        json={"name": SPEC_NAME, "env": {"KERNEL_USERNAME": "tester"}},  # EG refuses kernels for root
        headers=HEADERS,
        timeout=60,
    )
    assert started.status_code == 201, started.text
    kernel_id = started.json()["id"]
    channels = Channels(url, kernel_id)
    launcher, kernel = launched_tree(gateway_pid)
    try:
        reply, outputs = channels.execute("x = 41\nx + 1")
        assert reply["status"] == "ok", outputs
        assert text_of(outputs) == "42"

        # A guard refusal, judged from the disk: nothing was written outside the workspace.
        outside = workspace.parent / f"outside-{uuid.uuid4().hex}.txt"
        reply, outputs = channels.execute(f"open({str(outside)!r}, 'w').write('x')")
        assert reply["status"] == "error"
        assert not outside.exists()

        # No ivralo host runs beside EG (it has no provisioners): a brokered call says so, by name.
        reply, outputs = channels.execute("ivralo.call('photos.search', query='cats')")
        assert reply["ename"] == "BrokerError"
        assert "no ivralo host is attached to this kernel" in text_of(outputs)

        # The deadline from the kernelspec's env, enforced by the launched supervisor.
        reply, outputs = channels.execute("while True: pass", timeout=30)
        assert reply["status"] == "error"
        assert "exceeded deadline_ms=3000" in text_of(outputs)
        reply, outputs = channels.execute("x")
        assert text_of(outputs) == "41"  # the namespace survived the interrupt

        # EG's interrupt: a signal request on the launcher's comm port, passed to the kernel once.
        sleeping = channels.send("import time; time.sleep(60)")
        while channels.next_of(sleeping, 30)["msg_type"] != "execute_input":
            pass
        interrupted = requests.post(f"{url}/api/kernels/{kernel_id}/interrupt", headers=HEADERS, timeout=30)
        assert interrupted.status_code == 204, interrupted.text
        reply, outputs = channels.finish(sleeping)
        assert reply["status"] == "error"
        assert reply["ename"] == "KeyboardInterrupt"
    finally:
        channels.close()
        deleted = requests.delete(f"{url}/api/kernels/{kernel_id}", headers=HEADERS, timeout=30)
    assert deleted.status_code == 204, deleted.text
    wait_until(lambda: gone(launcher) and gone(kernel), 20, "the launcher and the kernel to end")
