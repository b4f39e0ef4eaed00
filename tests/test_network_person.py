"""Asking the person about an unknown host, through the running cell's stdin channel: the way a
notebook or ``jupyter console`` user answers ``input()``. Nobody to ask (nbclient) is a refusal.
Loopback only: an HTTP server on 127.0.0.1, reached as ``localhost``. Each test starts in a fresh
folder with nothing allowed, as a newcomer does; the server's hit count says whether the code got
through.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pexpect
import pytest
from console import jupyter_console
from jupyter_client.manager import KernelManager
from kernel_helpers import answering
from nbclient import NotebookClient
from servers import person_http_server

from ivralo_kernel.cli.install import install
from ivralo_kernel.host.sandbox.egress import untrusted_note
from ivralo_kernel.protocol.trust import set_trust

BIN = Path(sys.executable).parent
DEADLINE_MS = 2000


@pytest.fixture
def port() -> Iterator[int]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    httpd = person_http_server(Quiet)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(httpd.server_address[1])
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def fetch(port: int) -> str:
    return f"import urllib.request\nprint(urllib.request.urlopen('http://localhost:{port}/').status)"


@pytest.fixture
def deadline_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    prefix = tmp_path / "prefix"
    limits = {"deadline_ms": DEADLINE_MS, "interrupt_grace_ms": 500}  # the grace is shorter than the deadline
    install(prefix=str(prefix), name="ivralo-person", provisioner_config=limits)
    monkeypatch.setenv("JUPYTER_PATH", f"{prefix}/share/jupyter{os.pathsep}{os.environ['JUPYTER_PATH']}")
    return "ivralo-person"


def run_answering(km: KernelManager, code: str, answers: list[str], wait_s: float = 0.0) -> dict[str, Any]:
    """Execute with stdin allowed; answer each input request in turn (after ``wait_s``: a person
    who takes their time). Returns the prompts seen, the printed text, and the errors."""
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        done, prompts = answering(kc, code, answers, wait_s=wait_s)
    finally:
        kc.stop_channels()
    errors = [f"{o['content']['ename']}: {o['content']['evalue']}" for o in done.outputs if "ename" in o["content"]]
    return {"prompts": prompts, "stdout": done.stdout + done.stderr, "errors": errors}


def test_the_person_answers_yes_and_the_deadline_waits(workspace: Path, port: int, deadline_kernel: str) -> None:
    """A 2 s deadline, a person who takes 3 s: the cell still completes, and is not interrupted."""
    km = KernelManager(kernel_name=deadline_kernel)
    km.start_kernel(cwd=str(workspace))
    try:
        seen = run_answering(km, fetch(port), ["yes"], wait_s=3.0)
        question = f"Code in this cell wants to reach localhost, this machine, port {port}"
        assert seen["prompts"] == [f"{question}{untrusted_note(os.path.realpath(workspace))}. Allow? [yes/no] "]
        assert seen["errors"] == []
        assert seen["stdout"] == "200\n[ivralo network: localhost allowed until this kernel restarts]\n"
        again = run_answering(km, fetch(port), [])  # for the rest of this worker's life
        assert again["prompts"] == [] and again["stdout"].startswith("200\n")
    finally:
        km.shutdown_kernel(now=True)
    assert not (workspace / ".ivralo" / "permissions.json").exists()


def test_always_is_offered_and_recorded_only_in_a_trusted_folder(workspace: Path, port: int) -> None:
    km = KernelManager(kernel_name="ivralo")
    km.start_kernel(cwd=str(workspace))
    try:
        seen = run_answering(km, fetch(port), ["always", "n"])
    finally:
        km.shutdown_kernel(now=True)
    question = f"Code in this cell wants to reach localhost, this machine, port {port}"
    untrusted = question + untrusted_note(os.path.realpath(workspace))  # says what offers "always"
    assert seen["prompts"] == [
        f"{untrusted}. Allow? [yes/no] ",
        f"Please answer yes or no. {untrusted}. Allow? ",
    ]
    assert seen["stdout"] == "[ivralo network: localhost refused (the person said no)]\n"
    assert seen["errors"] and "localhost refused (the person said no)" in seen["errors"][0]
    assert not (workspace / ".ivralo" / "permissions.json").exists()

    set_trust(str(workspace), True, os.environ)
    km = KernelManager(kernel_name="ivralo")
    km.start_kernel(cwd=str(workspace))
    try:
        seen = run_answering(km, fetch(port), ["a"])
    finally:
        km.shutdown_kernel(now=True)
    assert seen["prompts"] == [f"{question}. Allow? [yes/always/no] "]
    assert seen["stdout"] == "200\n[ivralo network: localhost allowed (always: recorded in .ivralo/permissions.json)]\n"
    allowed = json.loads((workspace / ".ivralo" / "permissions.json").read_text())["hosts"]["allow"]
    assert allowed == [f"localhost:{port}"], "on this machine: that port alone"


def test_nobody_to_ask_in_nbclient(workspace: Path, port: int) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "ivralo", "language": "python", "display_name": "Python (ivralo)"}
    nb.cells = [
        nbformat.v4.new_code_cell(
            f"try:\n    {fetch(port).replace(chr(10), chr(10) + '    ')}\nexcept OSError as e:\n    print(e)"
        )
    ]
    NotebookClient(nb, timeout=60, resources={"metadata": {"path": str(workspace)}}).execute()
    text = "".join(o.get("text", "") for o in nb.cells[0].outputs)
    assert "localhost refused (nobody to ask)" in text
    assert text.endswith("[ivralo network: localhost refused (nobody to ask)]\n")


def test_jupyter_console_asks_at_its_prompt(workspace: Path, port: int) -> None:
    with jupyter_console("ivralo", workspace) as child:
        child.sendline(f"import urllib.request; print(urllib.request.urlopen('http://localhost:{port}/').status)")
        note = re.escape(untrusted_note(os.path.realpath(workspace)))
        asked = rf"Code in this cell wants to reach localhost, this machine, port {port}{note}\. Allow\? \[yes/no\] "
        child.expect(asked)
        child.sendline("yes")
        child.expect("200")
        child.expect(r"\[ivralo network: localhost allowed until this kernel restarts\]")
        child.expect(r"In \[3\]: ")
        child.sendline("exit")
        child.expect(pexpect.EOF)
    assert child.exitstatus == 0
