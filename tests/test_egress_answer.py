"""Who answers the egress question: the person, at the client, asked by the host itself.

The host's channel relay sends the question on the clients' stdin and keeps the answer; the kernel
never sees either. So a cell that replaces every ivralo object of its own process (every prompt,
the broker client, ipykernel's input functions) and forges every answer it can (a relayed
"always" over the broker, an ``input_reply`` on each of its sockets) gets no host through and
writes no grant. Judged from outside the kernel: a loopback server's request log and
``.ivralo/permissions.json`` on disk; and what the client saw on its own stdin channel.
"""

from __future__ import annotations

import json
import os
import queue
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest
from conftest import FALLBACK_KERNEL
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from sandbox_cases import counting_http
from test_prewarm import pool, spec  # noqa: F401 - a warm-pool kernelspec and a fresh pool

from ivralo_kernel.host.agent.outputs import CellOutput
from ivralo_kernel.host.jupyter import prewarm
from ivralo_kernel.host.sandbox.egress import untrusted_note
from ivralo_kernel.protocol.trust import set_trust

QUESTION = "Code in this cell wants to reach localhost, this machine, port {port}. Allow? [{choices}] "


def untrusted_question(port: int, workspace: Path) -> str:
    """The question in a folder that is not trusted: yes/no, and what offers "always" there."""
    note = untrusted_note(os.path.realpath(workspace))
    return QUESTION.format(port=port, choices="yes/no").replace(". Allow?", note + ". Allow?")


# Every object in the cell's process that could show the question or carry an answer says
# "always"; every answer it can send, it sends; then Python and `sh -c curl` try the person's port.
EVERY_SOCKET = ("stdin_socket", "iopub_socket", "shell_stream", "control_stream")
ATTACK = r"""
import builtins, subprocess, threading, urllib.request
import ipykernel.kernelbase
import ivralo_kernel.compat as compat
from ivralo_kernel.kernel import egress_judge
from ivralo_kernel.kernel.broker_client import BROKER
from ivralo_kernel.protocol import names

kernel = get_ipython().kernel
parent = kernel.get_parent("shell")
idents = compat.shell_parent_ident(kernel)
always = lambda *args, **kwargs: "always"
builtins.input = always
kernel.raw_input = kernel.getpass = kernel._input_request = always
ipykernel.kernelbase.Kernel.raw_input = ipykernel.kernelbase.Kernel._input_request = always
real_ask, real_deliver = BROKER.ask, BROKER.deliver
# Every answer the host sends this process reads "allowed" from now on.
allowing = lambda content: {{**content, "answer": {{**content.get("answer", {{}}), "allowed": True}}}}
BROKER.deliver = lambda content: real_deliver(allowing(content))
forged = []

def forge_everything():
    for stream in [getattr(kernel, name) for name in {sockets}]:
        for value in ("always", "yes", "a"):
            try:  # the session key is the clients' own: the signature is valid
                kernel.session.send(stream, "input_reply", {{"value": value}}, parent=parent, ident=idents)
                forged.append("input_reply")
            except Exception as error:
                forged.append(type(error).__name__)
    if len(forged) < 200:
        for kind in (names.BROKER_EGRESS_ANSWER, names.BROKER_EGRESS):
            payload = {{"host": "localhost", "port": {port}, "choice": "always", "person": True}}
            try:
                forged.append(str(real_ask(kind, payload, 5).get("reason")))
            except Exception as error:
                forged.append(type(error).__name__)

ALWAYS = "always: recorded in .ivralo/permissions.json"
BROKER.ask = lambda *args, **kwargs: {{"allowed": True, "reason": ALWAYS, "choice": "always"}}
egress_judge.egress_judge = lambda workspace: (lambda host, port: (True, "forged"))
results = {{}}

def fetch():
    try:
        results["python"] = urllib.request.urlopen("http://localhost:{port}/python", timeout=120).status
    except Exception as error:
        results["python"] = str(error)[:200]

asking = threading.Thread(target=fetch)
asking.start()
curl = subprocess.Popen(["sh", "-c", "curl -sS -m 120 http://localhost:{port}/sh"], stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True)
forge_everything()
print("forging", flush=True)
while asking.is_alive():  # all the while the host's question is open
    forge_everything()
    asking.join(0.05)
print("results:", results, curl.communicate()[0], len(forged))
"""


def attack(port: int, sockets: tuple[str, ...] = EVERY_SOCKET) -> str:
    return ATTACK.format(port=port, sockets=repr(sockets))


@pytest.fixture
def trusted(workspace: Path) -> Path:
    """A trusted folder: "always" is offered, and would be written (the issue's measured case)."""
    set_trust(str(workspace), True, os.environ)
    return workspace


@pytest.fixture
def kc(trusted: Path) -> Iterator[BlockingKernelClient]:
    manager = KernelManager(kernel_name="ivralo")
    manager.start_kernel(cwd=str(trusted))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        yield client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def granted(workspace: Path) -> Any:
    path = workspace / ".ivralo" / "permissions.json"
    return json.loads(path.read_text()) if path.exists() else None


Answer = Callable[[str, str], str | None]  # (prompt, the cell's stdout so far) -> what to type; None: not yet


def as_a_person(
    kc: BlockingKernelClient,
    code: str,
    answer: Answer,
    allow_stdin: bool = True,
    parented: bool = False,
    timeout: float = 90,
) -> tuple[list[str], str]:
    """Run ``code`` as a person at a console would (``parented``: at JupyterLab, whose reply names
    the request it answers), answering each ``input_request`` with ``answer`` once it says what to
    type. Returns the prompts the client got and the cell's stdout."""
    msg_id = kc.execute(code, allow_stdin=allow_stdin)
    prompts: list[str] = []
    waiting: dict[str, Any] | None = None
    shown = CellOutput()
    deadline = time.monotonic() + timeout
    idle = False
    while not idle:
        assert time.monotonic() < deadline, f"no idle; prompts {prompts}, stdout {shown.streams}"
        try:
            msg = kc.get_stdin_msg(timeout=0.02)
            if msg["header"]["msg_type"] == "input_request":
                prompts.append(msg["content"]["prompt"])
                waiting = msg
        except queue.Empty:
            pass
        if waiting is not None:
            typed = answer(waiting["content"]["prompt"], shown.streams.get("stdout", ""))
            if typed is not None and parented:
                kc.stdin_channel.send(kc.session.msg("input_reply", {"value": typed}, parent=waiting))
            elif typed is not None:
                kc.input(typed)  # as jupyter console does: a reply without a parent
            if typed is not None:
                waiting = None
        try:
            msg = kc.get_iopub_msg(timeout=0.02)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["header"]["msg_type"] == "stream":
            shown.add(msg)
        elif msg["header"]["msg_type"] == "status":
            idle = msg["content"]["execution_state"] == "idle"
    return prompts, shown.streams.get("stdout", "") + shown.streams.get("stderr", "")


def once_forging(typed: str) -> Answer:
    """The person's answer, given only once the cell forges its own answers (it goes on until the
    host's question is settled)."""
    return lambda _prompt, stdout: typed if "forging" in stdout else None


def test_a_cell_that_answers_for_the_person_gets_nothing_through_and_writes_no_grant(
    trusted: Path, kc: BlockingKernelClient
) -> None:
    """The person says no; the cell's forged "always" everywhere counts for nothing."""
    with counting_http() as (port, hits):
        prompts, stdout = as_a_person(kc, attack(port), once_forging("no"))
    assert hits == [], stdout
    assert granted(trusted) is None, stdout
    # The person saw the host's question, once (curl's wait shares it), and answered it.
    assert prompts == [QUESTION.format(port=port, choices="yes/always/no")], stdout
    assert "the person said no" in stdout and "forging" in stdout, stdout


@pytest.mark.parametrize("client", ["console", "lab"])
def test_the_persons_always_still_gets_through_and_only_the_host_writes_it(
    trusted: Path, kc: BlockingKernelClient, client: str
) -> None:
    """The same cell, and the person says "always": both the cell's Python and its curl get
    through (one question), and the host writes the grant."""
    with counting_http() as (port, hits):
        prompts, stdout = as_a_person(kc, attack(port), once_forging("always"), parented=client == "lab")
    assert sorted(hits) == ["/python", "/sh"], stdout
    assert prompts == [QUESTION.format(port=port, choices="yes/always/no")], stdout
    assert granted(trusted) == {"hosts": {"allow": [f"localhost:{port}"]}}, "on this machine: that port alone"


def test_a_person_who_says_yes_gets_through_and_nothing_is_written(workspace: Path) -> None:
    """A folder that is not trusted: yes/no only; "yes" lasts this kernel's life, on disk nothing."""
    manager = KernelManager(kernel_name="ivralo")
    manager.start_kernel(cwd=str(workspace))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        with counting_http() as (port, hits):
            code = f"import urllib.request\nprint(urllib.request.urlopen('http://localhost:{port}/yes').status)"
            prompts, stdout = as_a_person(client, code, lambda _prompt, _stdout: "yes")
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    assert hits == ["/yes"], stdout
    assert prompts == [untrusted_question(port, workspace)]
    assert granted(workspace) is None


def test_a_client_that_does_not_allow_stdin_is_never_asked(trusted: Path, kc: BlockingKernelClient) -> None:
    """``allow_stdin`` false (as nbclient sends it): no prompt reaches the client, the answer is no."""
    with counting_http() as (port, hits):
        prompts, stdout = as_a_person(kc, attack(port), once_forging("always"), allow_stdin=False)
    assert prompts == [], stdout
    assert hits == [], stdout
    assert granted(trusted) is None
    assert "nobody to ask" in stdout, stdout


def test_in_nbclient_the_forging_cell_writes_no_grant_and_the_next_kernel_is_asked_again(trusted: Path) -> None:
    """The issue's measured case: nbclient, nobody watching, a cell answering "always" itself. No
    grant is written, so the next kernel of the folder reaches nothing unasked either."""
    with counting_http() as (port, hits):
        # Not on shell: nbclient takes any message there for the cell's reply, and fails.
        for code in (attack(port, ("stdin_socket", "iopub_socket")), f"!curl -sS -m 30 http://localhost:{port}/next"):
            nb = nbformat.v4.new_notebook()
            nb.metadata["kernelspec"] = {"name": "ivralo", "language": "python", "display_name": "Python (ivralo)"}
            nb.cells = [nbformat.v4.new_code_cell(code)]
            NotebookClient(nb, timeout=90, resources={"metadata": {"path": str(trusted)}}).execute()
            text = "".join(o.get("text", "") for o in nb.cells[0].outputs)
            assert "nobody to ask" in text, text
    assert hits == []
    assert granted(trusted) is None


def test_the_clients_side_of_the_relay_is_closed_to_the_kernel_whatever_is_allowed(trusted: Path) -> None:
    """With all of ``localhost`` and ``127.0.0.1`` allowed (the person's own choice), the kernel still cannot reach
    its clients' Jupyter ports through the proxy: there it could take its client's place on stdin
    and answer the host's questions. Judged by the proxy's own record of what it connected."""
    (trusted / ".ivralo").mkdir(exist_ok=True)
    (trusted / ".ivralo" / "permissions.json").write_text('{"hosts": {"allow": ["localhost", "127.0.0.1"]}}')
    manager = KernelManager(kernel_name="ivralo")
    manager.start_kernel(cwd=str(trusted))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        ports = {channel: manager.get_connection_info()[f"{channel}_port"] for channel in ("stdin", "shell")}
        code = (
            "import subprocess, urllib.request\n"
            f"for port in {sorted(ports.values())!r}:\n"
            "    try:\n"
            "        urllib.request.urlopen(f'http://localhost:{port}/', timeout=30)\n"
            "    except Exception as error:\n"
            "        print('python', port, error)\n"
            "    r = subprocess.run(['sh', '-c', f'curl -sS -m 30 http://127.0.0.1:{port}/'], capture_output=True,"
            " text=True)\n"
            "    print('sh', port, r.stdout + r.stderr)\n"
        )
        prompts, stdout = as_a_person(client, code, lambda _prompt, _stdout: "no")
        decisions = list(manager.provisioner.egress_proxy.decisions)  # type: ignore[attr-defined]
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    tried = [(host, port, allowed) for host, port, allowed in decisions if port in ports.values()]
    assert sorted(tried) == sorted(
        [(name, port, False) for port in ports.values() for name in ("localhost", "127.0.0.1")]
    ), (decisions, stdout)
    assert "own Jupyter channels" in stdout, stdout
    assert prompts == []


INTERLEAVED = r"""
import threading, time, urllib.request
results = {{}}

def fetch():
    try:
        results["fetch"] = urllib.request.urlopen("http://localhost:{port}/both", timeout=60).status
    except Exception as error:
        results["fetch"] = str(error)[:120]

asking = threading.Thread(target=fetch)
asking.start()
time.sleep(0.5)  # the cell's own choice: its input() and the host's question are open at once, in either order
name = input("your name? ")
asking.join()
print("kernel got", repr(name), results)
"""


@pytest.mark.parametrize(("host_answer", "kernel_answer"), [("no", "always"), ("yes", "no")])
def test_the_kernels_own_input_and_the_hosts_question_each_get_their_answer(
    trusted: Path, kc: BlockingKernelClient, host_answer: str, kernel_answer: str
) -> None:
    """A console answers its prompts in the order it shows them, with replies that name none: the
    cell's own ``input()`` gets what was typed at it, the host's question what was typed there."""

    def person(prompt: str, _stdout: str) -> str:
        return kernel_answer if prompt == "your name? " else host_answer

    with counting_http() as (port, hits):
        prompts, stdout = as_a_person(kc, INTERLEAVED.format(port=port), person)
    assert sorted(prompts) == sorted(["your name? ", QUESTION.format(port=port, choices="yes/always/no")]), stdout
    assert hits == (["/both"] if host_answer == "yes" else []), stdout
    assert granted(trusted) is None
    assert f"kernel got {kernel_answer!r}" in stdout, stdout


def test_a_notebook_served_by_a_warm_spare_is_asked_on_its_own_relay(
    spec: str,  # noqa: F811
    pool: prewarm.SparePool,  # noqa: F811
    workspace: Path,
) -> None:
    """The spare's host parts move to the notebook's provisioner, and so does who asks: the
    question reaches the notebook's client, and its "yes" gets through."""
    first = KernelManager(kernel_name=spec)
    first.start_kernel(cwd=str(workspace))
    second = KernelManager(kernel_name=spec)
    try:
        key = first.provisioner.spare_key  # type: ignore[attr-defined]
        assert pool.wait_ready(1, timeout=120, key=key), "no spare became ready"
        second.start_kernel(cwd=str(workspace))
        assert second.provisioner.adopted_pid is not None  # type: ignore[attr-defined]
        client = second.client()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
            with counting_http() as (port, hits):
                code = f"import urllib.request\nprint(urllib.request.urlopen('http://localhost:{port}/spare').status)"
                prompts, stdout = as_a_person(client, code, lambda _prompt, _stdout: "yes")
        finally:
            client.stop_channels()
    finally:
        second.shutdown_kernel(now=True)
        first.shutdown_kernel(now=True)
    assert prompts == [untrusted_question(port, workspace)], stdout
    assert hits == ["/spare"], stdout


def test_an_answer_to_a_question_of_a_restarted_kernel_decides_nothing(trusted: Path) -> None:
    """The kernel is restarted while the host's question is open at the client: the question ends
    (a no), and the person's "always" typed there afterwards is nobody's: nothing is written, and
    the new kernel is asked again."""
    manager = KernelManager(kernel_name="ivralo")
    manager.start_kernel(cwd=str(trusted))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        with counting_http() as (port, hits):
            code = f"import urllib.request\nurllib.request.urlopen('http://localhost:{port}/old', timeout=60)"
            client.execute(code, allow_stdin=True)
            question = client.get_stdin_msg(timeout=60)
            assert question["content"]["prompt"] == QUESTION.format(port=port, choices="yes/always/no")
            manager.restart_kernel(now=True)
            client.input("always")  # at the prompt the client still shows
            client.wait_for_ready(timeout=60)
            again = f"import urllib.request\nprint(urllib.request.urlopen('http://localhost:{port}/new').status)"
            prompts, stdout = as_a_person(client, again, lambda _prompt, _stdout: "no")
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    assert prompts == [QUESTION.format(port=port, choices="yes/always/no")], stdout
    assert hits == [], stdout
    assert granted(trusted) is None


def test_without_the_sandbox_the_person_is_asked_on_the_relay_and_the_forging_cell_writes_no_grant(
    trusted: Path,
) -> None:
    """Without the OS sandbox the kernel's sockets are ipc files behind the host's relay too: the
    host asks the person there, and the cell's forged "always" counts for nothing."""
    manager = KernelManager(kernel_name=FALLBACK_KERNEL)
    manager.start_kernel(cwd=str(trusted))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        with counting_http() as (port, hits):
            prompts, stdout = as_a_person(client, attack(port), once_forging("no"))
            got = list(hits)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    assert got == [], stdout
    assert prompts == [QUESTION.format(port=port, choices="yes/always/no")], stdout
    assert granted(trusted) is None, stdout
