"""The kernel driven the ways its users drive it: console's KernelManager, nbclient's
AsyncKernelManager, nbclient on a notebook, and a raw launch of kernel.json argv like VS Code's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import nbformat
import pytest
from conftest import gone, kernel_in_tree, wait_until
from jupyter_client import AsyncKernelManager, KernelManager
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.connect import write_connection_file
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.session import Session
from kernel_helpers import execute, raw_client, reply_to
from nbclient import NotebookClient


def test_console_path_keeps_variables_and_reports_ivralo(kc: BlockingKernelClient, workspace: Path) -> None:
    assert execute(kc, "x = 6 * 7").status == "ok"
    assert execute(kc, "print(x)").stdout == "42\n"
    reply = kc.kernel_info(reply=True, timeout=10)["content"]
    section = reply["ivralo"]
    assert section["workspace"] == str(workspace.resolve())
    assert section["role"] == "specialist"
    assert section["bootstrap_ms"] > 0 and section["pid"] > 1
    assert section["layers"]["memory_cap"] == "RLIMIT_DATA" and section["layers"]["dumpable"] is False
    assert "kernel subshells" not in reply["supported_features"]
    assert reply["implementation"] == "ivralo"


def test_execute_on_control_is_refused(kc: BlockingKernelClient) -> None:
    msg = kc.session.msg("execute_request", {"code": "open('/tmp/x','w')", "silent": False})
    kc.control_channel.send(msg)
    reply = kc.get_control_msg(timeout=10)
    while reply["parent_header"].get("msg_id") != msg["header"]["msg_id"]:
        reply = kc.get_control_msg(timeout=10)
    assert reply["content"]["status"] == "error"
    assert "refused" in reply["content"]["evalue"] and "shell" in reply["content"]["evalue"]


def test_subshells_are_refused(kc: BlockingKernelClient) -> None:
    msg = kc.session.msg("create_subshell_request", {})
    kc.control_channel.send(msg)
    reply = kc.get_control_msg(timeout=10)
    while reply["parent_header"].get("msg_id") != msg["header"]["msg_id"]:
        reply = kc.get_control_msg(timeout=10)
    assert reply["content"]["status"] == "error"
    assert "subshells are not supported" in reply["content"]["evalue"]


def test_interrupt_reaches_user_code(km: KernelManager, kc: BlockingKernelClient) -> None:
    msg_id = kc.execute("import time\nprint('running', flush=True)\nfor _ in range(600): time.sleep(0.1)")
    # Handshake: the cell itself says it runs. (`busy` is published before ipykernel installs its
    # SIGINT handler, so an interrupt right after `busy` can be lost: that is ipykernel's window.)
    wait_until(lambda: kc.get_iopub_msg(timeout=5)["content"].get("text") == "running\n", 10, "the cell to run")
    km.interrupt_kernel()
    reply = reply_to(kc, msg_id, 20)  # a late kernel_info_reply (wait_for_ready's) may come first
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    after = execute(kc, "print('still here')")
    if after.reply["content"]["status"] == "aborted":
        # ipykernel 7's abort window after an error reply ends by a message its shell-channel thread
        # posts asynchronously; a request sent the moment the reply arrives can land before it and
        # is aborted (not run). That is ipykernel's, plain ipykernel included: the kernel is alive,
        # and the next request runs.
        after = execute(kc, "print('still here')")
    assert after.stdout == "still here\n", (after.reply["content"], after.stderr, after.outputs)


def test_ipython_features_keep_working(kc: BlockingKernelClient) -> None:
    assert execute(kc, "%time y = sum(range(10))").status == "ok"
    assert execute(kc, "print(y)").stdout == "45\n"
    shown = execute(kc, "from IPython.display import HTML, display\ndisplay(HTML('<b>hi</b>'))")
    assert any("text/html" in o["content"].get("data", {}) for o in shown.outputs)
    plotted = execute(kc, "%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.show()")
    assert any("image/png" in o["content"].get("data", {}) for o in plotted.outputs), plotted.stderr
    widget = execute(kc, "import ipywidgets\nw = ipywidgets.IntSlider(3)\ndisplay(w)")
    kinds = {o["header"]["msg_type"] for o in widget.outputs}
    assert "comm_open" in kinds
    assert any("application/vnd.jupyter.widget-view+json" in o["content"].get("data", {}) for o in widget.outputs)
    completion = kc.complete("import collec", reply=True, timeout=10)["content"]
    assert "collections" in completion["matches"]
    inspection = kc.inspect("len", reply=True, timeout=10)["content"]
    assert inspection["found"] and "Return the number of items" in inspection["data"]["text/plain"]
    history = kc.history(hist_access_type="tail", n=3, reply=True, timeout=10)["content"]
    assert history["status"] == "ok" and history["history"]


async def test_async_kernel_manager_path(workspace: Path) -> None:
    manager = AsyncKernelManager(kernel_name="ivralo")
    await manager.start_kernel(cwd=str(workspace))
    try:
        client = manager.client()
        client.start_channels()
        await client.wait_for_ready(timeout=60)
        reply = await client.execute_interactive("print('async', 1 + 1)", timeout=30)
        assert reply["content"]["status"] == "ok"
        client.stop_channels()
    finally:
        await manager.shutdown_kernel(now=True)


def test_nbclient_executes_a_notebook(workspace: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "ivralo", "language": "python", "display_name": "Python (ivralo)"}
    nb.cells = [nbformat.v4.new_code_cell("a = 20"), nbformat.v4.new_code_cell("print(a + 22)")]
    NotebookClient(nb, timeout=60, resources={"metadata": {"path": str(workspace)}}).execute()
    assert nb.cells[1].outputs[0]["text"] == "42\n"


def test_raw_launch_of_kernel_json_like_vscode(workspace: Path, tmp_path: Path) -> None:
    """VS Code runs argv itself with its whole environment, and stops the kernel with SIGTERM."""
    spec = KernelSpecManager().get_kernel_spec("ivralo")
    connection_file, _ = write_connection_file(str(tmp_path / "kernel-raw.json"))
    argv = [part.format(connection_file=connection_file) for part in spec.argv]
    env = dict(os.environ, IVRALO_TEST_API_KEY="sk-raw-launch-secret", PYDEVD_IPYTHON_COMPATIBLE_DEBUGGING="1")
    proc = subprocess.Popen(argv, cwd=workspace, env=env, stdin=subprocess.DEVNULL)
    kernel_pid = None
    try:
        client = raw_client(connection_file)
        client.wait_for_ready(timeout=60)
        probe = execute(
            client,
            "import os, subprocess, json\n"
            "child = subprocess.run(['env'], capture_output=True, text=True).stdout\n"
            "print(json.dumps({'environ': 'IVRALO_TEST_API_KEY' in os.environ,"
            " 'proc': b'sk-raw-launch-secret' in open('/proc/self/environ','rb').read(),"
            " 'child': 'sk-raw-launch-secret' in child, 'pid': os.getpid(), 'cwd': os.getcwd()}))",
        )
        seen = json.loads(probe.stdout)
        kernel_pid = kernel_in_tree(proc.pid)
        assert seen["environ"] is False and seen["proc"] is False and seen["child"] is False
        assert seen["cwd"] == str(workspace.resolve())
        supervisor_env = Path(f"/proc/{proc.pid}/environ").read_bytes()
        assert b"sk-raw-launch-secret" not in supervisor_env
        # No ivralo host is attached: a brokered call fails at once (this message, not the one after
        # waiting 30 s for a host's hello), saying why and what to do.
        brokered = execute(client, "ivralo.call('photos.search', query='x')", timeout=20)
        assert brokered.reply["content"]["ename"] == "BrokerError"
        evalue = brokered.reply["content"]["evalue"]
        assert evalue.startswith("no ivralo host is attached to this kernel to answer"), evalue
        assert "Run it under an ivralo host: JupyterLab, jupyter console" in evalue
        client.stop_channels()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) is not None
    assert kernel_pid is not None
    wait_until(lambda: gone(kernel_pid), 5, "the kernel to exit after SIGTERM of the supervisor")


@pytest.mark.fast
def test_kernelspec_in_repo_matches_the_generator() -> None:
    from ivralo_kernel.host.jupyter.kernelspec import kernel_spec_dict

    shipped = json.loads((Path(__file__).parents[1] / "kernelspec" / "kernel.json").read_text())
    assert shipped == kernel_spec_dict(python="python")


def test_a_client_that_asks_for_ipc_keeps_working_across_a_restart(workspace: Path, tmp_path: Path) -> None:
    """``--KernelManager.transport=ipc``: the clients' socket files are the host's relay's (the
    kernel's own are in its sandbox), bound again after jupyter_client's restart removes them."""
    km = KernelManager(kernel_name="ivralo", transport="ipc", ip=str(tmp_path / "kernel"))
    km.start_kernel(cwd=str(workspace))
    clients = [km.client()]
    try:
        clients[0].start_channels()
        clients[0].wait_for_ready(timeout=60)
        assert execute(clients[0], "print(1 + 1)").stdout == "2\n"
        km.restart_kernel(now=True)
        # A client that connects after the restart, as a new browser tab does: with a session (a
        # routing identity) of its own. Two live clients sharing one identity get the replies on
        # whichever connected last (ROUTER_HANDOVER, as ipykernel sets it: channel_relay.py).
        own_session = Session(key=km.session.key, signature_scheme=km.session.signature_scheme)
        clients.append(km.client(session=own_session))
        clients[1].start_channels()
        clients[1].wait_for_ready(timeout=60)
        assert execute(clients[1], "print(2 + 2)").stdout == "4\n"
        assert execute(clients[0], "print(3 + 3)").stdout == "6\n"  # the first client, still connected
    finally:
        for client in clients:
            client.stop_channels()
        km.shutdown_kernel(now=True)
