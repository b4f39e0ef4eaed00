"""Warm spare kernels in real JupyterLab, in headless Chromium (issue 17): a notebook opened in a folder
with a warm spare gets that spare (the same process, seen from the page and from the host), already
guarded; the pool refills; and the server's exit ends every kernel and spare it had.

The spare's pid comes from the server's log (the pool's "ready" line, the handshake waited on under a
deadline). Inside the sandbox the kernel has a pid namespace of its own, so its ``os.getpid()`` means
nothing on the host: the page prints its pid namespace and its start time (``/proc/self/stat``), which
the host reads for the spare's kernel process too.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import gone, kernel_in_tree, wait_until
from servers import jupyter_server
from test_jupyterlab import CHROMIUM, CHROMIUM_ARGS, TOKEN, open_notebook, playwright, run_in_last_cell
from test_jupyterlab import pytestmark as lab_marks

from ivralo_kernel.cli.install import install
from ivralo_kernel.host.sandbox.bwrap import availability

SPEC = "ivralo-lab-spares"
DISPLAY = "Python (ivralo, warm spares)"
READY = re.compile(r"ivralo: a warm spare kernel \(pid (\d+)\) is ready for (.+) \((\S+)\)")
pytestmark = [*lab_marks, pytest.mark.skipif(availability()[0] is None, reason="spares need the bwrap sandbox")]
LAB_ARGS = (
    "--no-browser", "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    "--LabApp.extension_manager=readonly",
)  # fmt: skip
# In the kernel: its pid namespace and its start time, both the same seen from the host.
IDENTITY_CELL = (
    "import os\nprint(os.readlink('/proc/self/ns/pid'), open('/proc/self/stat').read().rsplit(')', 1)[1].split()[19])"
)


def identity(pid: int) -> str:
    """What IDENTITY_CELL prints in the kernel whose host pid this is."""
    with open(f"/proc/{pid}/stat") as f:
        start = f.read().rsplit(")", 1)[1].split()[19]
    return f"{os.readlink(f'/proc/{pid}/ns/pid')} {start}"


def ready_spares(log: Path, workspace: Path) -> list[int]:
    """The pids of the spares the server's pool announced ready for this folder, in order."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return [int(m[1]) for m in READY.finditer(text) if m[2] == str(workspace) and m[3] == SPEC]


def cmdline(process: psutil.Process) -> list[str]:
    try:
        return list(process.cmdline())
    except psutil.Error:  # a zombie, or gone
        return []


def tree(pid: int) -> list[int]:
    try:
        return [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        return [pid]


@pytest.mark.timeout(300)
def test_a_notebook_takes_the_warm_spare_already_guarded(tmp_path: Path) -> None:
    prefix = Path(os.environ["JUPYTER_PATH"]).parents[1]
    install(prefix=str(prefix), name=SPEC, display_name=DISPLAY, provisioner_config={"spares": 1})
    settings = Path(os.environ["JUPYTER_CONFIG_DIR"]) / "lab/user-settings/@jupyterlab/apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    folder = tmp_path / "project"  # the server's root: the notebook's folder and its kernels' workspace
    folder.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    log = tmp_path / "project-jupyterlab.log"  # servers.jupyter_server's log, beside the root
    workspace = folder.resolve()
    kernels: list[int] = []
    with jupyter_server("jupyterlab", folder, TOKEN, *LAB_ARGS) as url:
        port = url.rsplit(":", 1)[1]
        (server,) = [c for c in psutil.Process().children() if f"--ServerApp.port={port}" in cmdline(c)]
        # The folder's first kernel, as a first notebook starts it: the pool fills after it.
        request = urllib.request.Request(
            f"{url}/api/kernels",
            data=json.dumps({"name": SPEC, "path": ""}).encode(),
            headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            assert response.status == 201
        wait_until(lambda: len(ready_spares(log, workspace)) >= 1, 120, "the pool's first spare, ready")
        (spare,) = ready_spares(log, workspace)
        spare_kernel = kernel_in_tree(spare)
        expected = identity(spare_kernel)
        kernels += [c.pid for c in server.children()]

        with playwright.sync_playwright() as p:
            home = tmp_path / "browser-home"
            home.mkdir()
            browser = p.chromium.launch(
                executable_path=CHROMIUM, args=CHROMIUM_ARGS, env={**os.environ, "HOME": str(home)}
            )
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                lab: dict[str, Any] = {"url": url, "nbdir": folder, "root": tmp_path}
                open_notebook(page, lab, "warm.ipynb", SPEC, DISPLAY)
                expect = playwright.expect
                cells = page.locator(".jp-Notebook .jp-Cell")
                run_in_last_cell(page, IDENTITY_CELL)
                # The kernel the page reached is the spare's, the very process that waited.
                expect(cells.nth(0).locator(".jp-OutputArea-output")).to_have_text(expected, timeout=30_000)
                assert f"a warm spare kernel (pid {spare}) serves this notebook" in log.read_text()
                # Already guarded: a write outside the folder is refused (judged on disk).
                escaped = outside / "escaped.txt"
                run_in_last_cell(page, f"open({str(escaped)!r}, 'w').write('out')")
                expect(cells.nth(1).locator(".jp-OutputArea-output")).to_contain_text(
                    "GuardRefusal: ivralo write guard", timeout=30_000
                )
                assert not escaped.exists()
                page.screenshot(path=str(tmp_path / "warm-spare.png"))
            finally:
                browser.close()
        # The pool refilled: another kernel waits for the folder's next notebook.
        wait_until(lambda: len(ready_spares(log, workspace)) >= 2, 120, "the pool's refill, ready")
        refill = ready_spares(log, workspace)[1]
        assert refill != spare
        everything = [pid for root in {*kernels, spare, refill} for pid in tree(root)]
        assert psutil.pid_exists(refill) and not gone(refill)
    # The server's exit ended every kernel it ran and every spare its pool kept.
    wait_until(lambda: all(gone(pid) for pid in everything), 30, "every kernel and spare of the server to end")
