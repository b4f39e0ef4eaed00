"""JupyterLab's path: jupyter_server starts the kernelspec (and so the provisioner), the browser
talks over the kernel websocket. A cell sent that way is held to its deadline too."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests
import websocket
from servers import jupyter_server

from ivralo_kernel.cli.install import install

TOKEN = uuid.uuid4().hex
DEADLINE_MS, GRACE_MS = 1500, 700
BOUND_S = (DEADLINE_MS + GRACE_MS + 250) / 1000 + 0.75  # + liveness slack for a loaded machine
INTERRUPTED = f"interrupted: exceeded deadline_ms={DEADLINE_MS}; namespace preserved (partial side effects possible)"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    prefix = Path(os.environ["JUPYTER_PATH"]).parents[1]
    install(
        prefix=str(prefix),
        name="ivralo-deadline",
        display_name="Python (ivralo, server deadline test)",
        provisioner_config={
            "deadline_ms": DEADLINE_MS,
            "interrupt_grace_ms": GRACE_MS,
        },
    )
    root = tmp_path_factory.mktemp("server-root")
    with jupyter_server("jupyter_server", root, TOKEN) as url:
        yield url


def auth() -> dict[str, str]:
    return {"Authorization": f"token {TOKEN}"}


class Browser:
    """What JupyterLab's kernel connection does, over the same websocket."""

    def __init__(self, url: str, kernel_id: str) -> None:
        ws_url = url.replace("http", "ws") + f"/api/kernels/{kernel_id}/channels"
        self.ws = websocket.create_connection(ws_url, header=[f"Authorization: token {TOKEN}"], timeout=30)
        self.session = uuid.uuid4().hex

    def send_shell(self, msg_type: str, content: dict[str, Any]) -> str:
        """Send a request the way JupyterLab does over the kernel websocket; return its msg_id."""
        msg_id = uuid.uuid4().hex
        header = {
            "msg_id": msg_id,
            "msg_type": msg_type,
            "username": "browser",
            "session": self.session,
            "version": "5.4",
            "date": datetime.now(UTC).isoformat(),
        }
        message = {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell"}
        self.ws.send(json.dumps({**message, "buffers": []}))
        return msg_id

    def execute(self, code: str, timeout: float = 30) -> tuple[dict[str, Any], list[dict[str, Any]], float]:
        content = {
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        }
        start = time.monotonic()
        msg_id = self.send_shell("execute_request", content)
        outputs: list[dict[str, Any]] = []
        reply: dict[str, Any] = {}
        idle = False
        while not (idle and reply):
            assert time.monotonic() - start < timeout, f"no answer for {code!r}; got {outputs}"
            msg = json.loads(self.ws.recv())
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                outputs.append(msg) if msg["msg_type"] == "status" else None
                continue
            if msg["msg_type"] == "execute_reply":
                reply = msg
            elif msg["msg_type"] == "status":
                idle = msg["content"]["execution_state"] == "idle"
            elif msg["msg_type"] != "execute_input":
                outputs.append(msg)
        return reply, outputs, time.monotonic() - start

    def wait_until_answered(self, timeout: float) -> None:
        """What jupyter_client's wait_for_ready does: ask kernel_info until a kernel answers it on shell
        AND its status for that request arrives on IOPub (both channels are back)."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            msg_id = self.send_shell("kernel_info_request", {})
            replied = on_iopub = False
            asked = time.monotonic()
            while time.monotonic() - asked < 1.0 and not (replied and on_iopub):
                try:
                    self.ws.settimeout(0.2)
                    msg = json.loads(self.ws.recv())
                except websocket.WebSocketTimeoutException:
                    continue
                finally:
                    self.ws.settimeout(30)
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                if msg["msg_type"] == "kernel_info_reply":
                    if msg["content"].get("status") != "ok":
                        break  # answered by the host while it was replacing the kernel: ask again
                    replied = True
                elif msg["msg_type"] == "status":
                    on_iopub = True
            if replied and on_iopub:
                return
        raise AssertionError(f"no kernel answered kernel_info on shell and IOPub within {timeout} s")

    def close(self) -> None:
        self.ws.close()


def test_browser_execution_is_cut_at_its_deadline(server: str) -> None:
    created = requests.post(f"{server}/api/kernels", json={"name": "ivralo-deadline"}, headers=auth(), timeout=30)
    assert created.status_code == 201, created.text
    kernel_id = created.json()["id"]
    browser = Browser(server, kernel_id)
    try:
        reply, _, _ = browser.execute("x = 41")
        assert reply["content"]["status"] == "ok"
        reply, outputs, elapsed = browser.execute("while True: pass")
        assert reply["content"]["status"] == "error"
        errors = [o for o in outputs if o["msg_type"] == "error"]
        assert errors and errors[0]["content"]["traceback"] == [INTERRUPTED], "the cell shows why it stopped"
        assert DEADLINE_MS / 1000 <= elapsed <= BOUND_S, elapsed
        reply, outputs, _ = browser.execute("print(x + 1)")
        assert [o["content"]["text"] for o in outputs if o["msg_type"] == "stream"] == ["42\n"]
    finally:
        browser.close()
        requests.delete(f"{server}/api/kernels/{kernel_id}", headers=auth(), timeout=30)


def test_a_kill_answers_the_cell_and_replaces_the_kernel_without_a_restart(server: str) -> None:
    """Native code ignoring SIGINT is killed at deadline + grace. The cell still gets its answer
    (why, and that the variables are gone), the kernel is replaced in place, and jupyter_server's
    restarter never sees a death: no "restarting", no count toward its restart limit."""
    created = requests.post(f"{server}/api/kernels", json={"name": "ivralo-deadline"}, headers=auth(), timeout=30)
    kernel_id = created.json()["id"]
    browser = Browser(server, kernel_id)
    try:
        browser.execute("x = 41")
        reply, outputs, elapsed = browser.execute("import time\ntime.sleep(0.2)\nsum(range(10**11))")
        assert elapsed <= BOUND_S + 2, elapsed  # + the time for the browser's sockets to reconnect
        assert reply["content"]["status"] == "error"
        errors = [o["content"]["traceback"][0] for o in outputs if o["msg_type"] == "error"]
        assert len(errors) == 1
        assert errors[0].startswith(
            f"ivralo ended this cell's kernel (timeout: execution exceeded deadline_ms={DEADLINE_MS}; observer: "
        )
        assert errors[0].endswith("All variables were lost; a fresh kernel is running now: re-run the cells you need.")
        states = [o["content"]["execution_state"] for o in outputs if o["msg_type"] == "status"]
        assert "restarting" not in states and "dead" not in states
        browser.wait_until_answered(timeout=30)  # the fresh kernel is up, as a frontend finds out
        reply, outputs, _ = browser.execute("print('fresh', 'x' in dir())", timeout=60)
        assert [o["content"]["text"] for o in outputs if o["msg_type"] == "stream"] == ["fresh False\n"]
        # The fresh kernel has a broker socket of its own (the dead one's may hold half a frame).
        reply, outputs, _ = browser.execute("print('hosts', type(ivralo.hosts()).__name__)", timeout=60)
        assert [o["content"]["text"] for o in outputs if o["msg_type"] == "stream"] == ["hosts list\n"], outputs
        model = requests.get(f"{server}/api/kernels/{kernel_id}", headers=auth(), timeout=10).json()
        assert model["execution_state"] != "dead"
    finally:
        browser.close()
        requests.delete(f"{server}/api/kernels/{kernel_id}", headers=auth(), timeout=30)
