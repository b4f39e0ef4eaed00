"""What a notebook user does in their first hour, over jupyter_client with ivralo's provisioner (the
path JupyterLab and ``jupyter console`` take), each judged on its output: ``!`` and ``%pip`` (a pty),
``%%bash``, a forked child's print, a local cluster on loopback, a widget's comm round trip, an inline
PNG, ``input()``, completion, inspection, ``%debug``, the debugger, restart. Fresh folder, nothing
allowed, Landlock on."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager
from kernel_helpers import answering, execute

from ivralo_kernel.cli.install import install


def test_shell_escapes_and_pip_run_in_a_pty(kc: BlockingKernelClient, workspace: Path) -> None:
    (workspace / "data.csv").write_text("a,b\n")
    listed = execute(kc, "!ls")
    assert "data.csv" in listed.stdout and "out of pty" not in listed.stdout + listed.stderr, listed
    piped = execute(kc, "%pip list")
    assert "ipykernel" in piped.stdout and "Error" not in piped.stdout, piped.stdout[-500:]
    bashed = execute(kc, "%%bash\necho from bash $((6 * 7))")
    assert bashed.stdout == "from bash 42\n"


def test_pip_install_outside_the_workspace_says_why_in_one_sentence(kc: BlockingKernelClient, workspace: Path) -> None:
    done = execute(kc, "%pip install ivralo-no-such-package")
    text = done.stdout + done.stderr + "".join(o["content"].get("evalue", "") for o in done.outputs)
    assert done.status == "error", text
    assert done.reply["content"]["ename"] == "UsageError"
    evalue = done.reply["content"]["evalue"]
    assert evalue.startswith("%pip install would write to ") and "outside the workspace" in evalue, evalue
    assert "Traceback" not in text and "Permission denied" not in text
    # The same sentence for the shell's pip and uv (not pip's "Read-only file system"), before they run.
    env = str(Path(sys.executable).parent.parent)  # the environment this interpreter (the kernel's) is in
    pip = Path(sys.executable).parent / "pip"
    ws = str(workspace.resolve())
    for line, what in (
        (f"!{pip} install ivralo-no-such-package", "!pip install"),
        (f"!{sys.executable} -m pip install -q ivralo-no-such-package", "!python -m pip install"),
        (f"!uv pip install --python {sys.executable} ivralo-no-such-package", "!uv pip install"),
        (f"out = !cd . && {sys.executable} -m pip uninstall -y ivralo-no-such-package", "!python -m pip uninstall"),
    ):
        done = execute(kc, line)
        command = line.split(" && ")[-1].removeprefix("out = !").removeprefix("!")
        assert (done.reply["content"]["ename"], done.reply["content"]["evalue"]) == (
            "UsageError",
            f"{what} would write to {env}, outside the workspace {ws} where code in this kernel may write, so run it "
            f"from a terminal instead ({command}), or make the project's own .venv inside the workspace and run the "
            "kernel from it.",
        ), (line, done.stdout, done.reply["content"])
    # Into the workspace, it runs and the tool says what it says (uv, offline: fails fast, or is not found).
    done = execute(kc, "!uv pip install --offline --target ./pkgs ivralo-no-such-package")
    assert done.status == "ok" and "would write to" not in done.stdout + done.stderr, done


def test_a_forked_child_prints_into_the_cell(kc: BlockingKernelClient) -> None:
    code = (
        "import multiprocessing as mp\n"
        "child = mp.get_context('fork').Process(target=print, args=('from the forked child',))\n"
        "child.start(); child.join(); print('exit', child.exitcode)"
    )
    done = execute(kc, code)
    assert done.stdout.splitlines() == ["from the forked child", "exit 0"], done


def test_a_local_cluster_on_loopback_is_never_asked_about(kc: BlockingKernelClient) -> None:
    """A server the kernel's tree runs on 127.0.0.1 (a multiprocessing manager, as a local Dask
    cluster is) and a client connecting to it: the kernel talking to itself, not reaching a host."""
    code = (
        "from multiprocessing.managers import SyncManager\n"
        "manager = SyncManager(address=('127.0.0.1', 0), authkey=b'k')\n"
        "manager.start()\n"
        "shared = manager.dict(answer=42)\n"
        "print('answer', shared['answer'])\n"
        "manager.shutdown()"
    )
    done, prompts = answering(kc, code, [])
    assert prompts == [], "nobody is asked about the kernel's own loopback links"
    assert done.stdout == "answer 42\n", done  # no "[ivralo network: ...]" line: nothing was judged


def test_a_widget_round_trip(kc: BlockingKernelClient) -> None:
    shown = execute(kc, "import ipywidgets\nw = ipywidgets.IntSlider(3)\ndisplay(w)")
    opened = [o for o in shown.outputs if o["header"]["msg_type"] == "comm_open"]
    model = next(
        o["content"]["comm_id"] for o in opened if o["content"]["data"]["state"].get("_model_name") == "IntSliderModel"
    )
    # The frontend moves the slider: a comm_msg on shell, as JupyterLab sends it.
    update = {"comm_id": model, "data": {"method": "update", "state": {"value": 7}, "buffer_paths": []}}
    kc.shell_channel.send(kc.session.msg("comm_msg", update))
    assert execute(kc, "print(w.value)").stdout == "7\n"


def test_inline_png_input_completion_inspection(kc: BlockingKernelClient) -> None:
    plotted = execute(kc, "%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1, 2]); plt.show()")
    assert any("image/png" in o["content"].get("data", {}) for o in plotted.outputs), plotted.stderr
    asked, prompts = answering(kc, "name = input('who? ')\nprint('hi', name)", ["bob"])
    assert prompts == ["who? "] and asked.stdout == "hi bob\n"
    completion = kc.complete("import collec", reply=True, timeout=10)["content"]
    assert "collections" in completion["matches"]
    inspection = kc.inspect("len", reply=True, timeout=10)["content"]
    assert inspection["found"] and "Return the number of items" in inspection["data"]["text/plain"]


def test_post_mortem_debug(kc: BlockingKernelClient) -> None:
    failed = execute(kc, "def f(x):\n    y = x * 2\n    raise ValueError(y)\nf(21)")
    assert failed.status == "error"
    debugged, prompts = answering(kc, "%debug", ["p y", "q"])
    assert prompts and prompts[0].startswith("ipdb>"), prompts
    assert "42" in debugged.stdout, debugged


def test_the_debugger_is_offered_but_debugpy_loads_at_the_first_debug_request(kc: BlockingKernelClient) -> None:
    """debugpy costs a sixth of a start's CPU (compat.defer_debugger_import): not loaded until asked."""
    info = kc.kernel_info(reply=True, timeout=10)["content"]
    assert "debugger" in info["supported_features"]
    loaded = execute(kc, "import sys; print(sorted(m for m in ('debugpy', 'pydevd') if m in sys.modules))")
    assert loaded.stdout.strip() == "[]", loaded
    msg = kc.session.msg("debug_request", {"type": "request", "seq": 1, "command": "debugInfo", "arguments": {}})
    kc.control_channel.send(msg)
    while (reply := kc.get_control_msg(timeout=30))["parent_header"].get("msg_id") != msg["header"]["msg_id"]:
        pass
    assert reply["content"]["success"], reply["content"]
    loaded = execute(kc, "import sys; print('debugpy' in sys.modules)")
    assert loaded.stdout.strip() == "True", loaded


def test_debugger_under_the_host_stops_at_a_breakpoint(kc: BlockingKernelClient) -> None:
    """JupyterLab's debugger: under the provisioner, pydevd's loopback connect is not asked about
    (an answer would have to come back on the control thread, which waits for it: a deadlock)."""
    seq = iter(range(1, 100))

    def debug(command: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        body = {"type": "request", "seq": next(seq), "command": command, "arguments": arguments or {}}
        msg = kc.session.msg("debug_request", body)
        kc.control_channel.send(msg)
        while True:
            reply = kc.get_control_msg(timeout=30)
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return dict(reply["content"])

    assert debug("initialize", {"clientID": "jupyterlab", "adapterID": "", "pathFormat": "path"})["success"]
    assert debug("attach")["success"]
    code = "def g(n):\n    m = n + 1\n    return m\n\ng(41)"
    source = debug("dumpCell", {"code": code})["body"]["sourcePath"]
    debug("setBreakpoints", {"breakpoints": [{"line": 2}], "source": {"path": source}})
    debug("configurationDone")
    kc.execute(code)
    while True:
        msg = kc.get_iopub_msg(timeout=30)
        if msg["header"]["msg_type"] == "debug_event" and msg["content"].get("event") == "stopped":
            break
    assert msg["content"]["body"]["reason"] == "breakpoint"
    assert debug("continue", {"threadId": msg["content"]["body"]["threadId"]})["success"]
    assert debug("disconnect", {"restart": False, "terminateDebuggee": True})["success"]


def test_restart_gives_a_fresh_guarded_kernel(km: KernelManager, kc: BlockingKernelClient) -> None:
    assert execute(kc, "import os\nx = 1\nprint(os.getpid())").status == "ok"
    before = km.provisioner.host_pid(kc.kernel_info(reply=True, timeout=10)["content"]["ivralo"]["pid"])
    km.restart_kernel(now=True)
    kc.wait_for_ready(timeout=60)
    after = kc.kernel_info(reply=True, timeout=10)["content"]["ivralo"]
    assert km.provisioner.host_pid(after["pid"]) != before and after["layers"]["write_guard"] == "audit hook"
    gone = execute(kc, "print('x' in globals())")
    assert gone.stdout == "False\n"


def _tiny_wheel(folder: Path) -> Path:
    """A pure-Python wheel made by hand (no build backend, no index): ``ivralo_tiny`` 1.0."""
    wheel = folder / "ivralo_tiny-1.0-py3-none-any.whl"
    files = {
        "ivralo_tiny/__init__.py": "ANSWER = 42\n",
        "ivralo_tiny-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: ivralo-tiny\nVersion: 1.0\n",
        "ivralo_tiny-1.0.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = [f"{name},," for name in files] + ["ivralo_tiny-1.0.dist-info/RECORD,,"]
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
        zf.writestr("ivralo_tiny-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return wheel


def test_pip_install_into_the_projects_own_venv_works(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A project's .venv inside the workspace: %pip install writes there, as in any kernel. The venv
    sees ivralo and its dependencies through a .pth file (no copy, no download); the package comes
    from a local wheel (no index). Judged on the files in the venv."""
    venv = workspace / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    site = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    # addsitedir, not a bare path: the outer site's own .pth files (the editable install) apply too.
    (site / "outer.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    wheels = workspace / "wheels"
    wheels.mkdir()
    _tiny_wheel(wheels)
    prefix = tmp_path / "prefix"
    install(prefix=str(prefix), name="ivralo-project", python=str(venv / "bin" / "python"))
    monkeypatch.setenv("JUPYTER_PATH", f"{prefix}/share/jupyter{os.pathsep}{os.environ['JUPYTER_PATH']}")
    manager = KernelManager(kernel_name="ivralo-project")
    manager.start_kernel(cwd=str(workspace))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        done = execute(client, "%pip install --no-index --find-links wheels ivralo-tiny", timeout=120)
        assert done.status == "ok", (done.stdout, done.stderr, done.reply["content"])
        assert "Successfully installed ivralo-tiny-1.0" in done.stdout, done.stdout
        assert execute(client, "import ivralo_tiny\nprint(ivralo_tiny.ANSWER)").stdout == "42\n"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    assert (site / "ivralo_tiny" / "__init__.py").read_text() == "ANSWER = 42\n"
