"""The JupyterLab extension in Notebook 7 (the ``notebook`` package), in headless Chromium: the same
prebuilt extension, loaded by Notebook's own page. Each cell's effects line and the host's egress
dialog are there; the status bar item is not, because Notebook 7's page has no status bar (it ships
no ``@jupyterlab/statusbar-extension``, so the plugin's optional ``IStatusBar`` is null and it adds
nothing: labextension/src/index.ts).

The browser and page fixtures and the helpers are tests/test_jupyterlab.py's; only the server differs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import showcase_shots
from servers import counting_person_server, jupyter_server
from test_jupyterlab import CHROMIUM, TOKEN, browser, page, playwright, run_in_last_cell

from ivralo_kernel.host.sandbox.egress import untrusted_note

pytest.importorskip("notebook", minversion="7")
__all__ = ["browser", "page"]  # fixtures, used by name
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM) and not os.environ.get("CI"),
        reason="Debian's chromium is not installed (apt-get install -y chromium); .ci/run installs it",
    ),
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Notebook 7's server (named ``lab`` for test_jupyterlab's fixtures): ``jupyter notebook``."""
    root = tmp_path_factory.mktemp("notebook7")
    # Notebook 7 reads JupyterLab's user settings: no news toast over the page.
    settings = Path(os.environ["JUPYTER_CONFIG_DIR"]) / "lab/user-settings/@jupyterlab/apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    nbdir = root / "notebooks"
    nbdir.mkdir()
    # JupyterLab's server extension runs inside Notebook's server too: the same switches as in
    # test_jupyterlab, so that nothing reaches beyond loopback.
    args = (
        "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
    )  # fmt: skip
    with jupyter_server("notebook", nbdir, TOKEN, *args) as url:
        yield {"url": url, "nbdir": nbdir, "root": root}


def open_notebook(page: Any, lab: dict[str, Any], name: str) -> None:
    """A fresh notebook with the ivralo kernel, opened at Notebook 7's /notebooks/ URL."""
    cell = {"cell_type": "code", "id": "c0", "metadata": {}, "execution_count": None, "outputs": [], "source": ""}
    kernelspec = {"name": "ivralo", "language": "python", "display_name": "Python (ivralo)"}
    notebook = {"cells": [cell], "metadata": {"kernelspec": kernelspec}, "nbformat": 4, "nbformat_minor": 5}
    (lab["nbdir"] / name).write_text(json.dumps(notebook))  # by hand: importing nbformat takes seconds here
    expect = playwright.expect
    page.goto(f"{lab['url']}/notebooks/{name}?token={TOKEN}")
    expect(page.locator("body[data-notebook=notebooks]")).to_have_count(1, timeout=60_000)  # Notebook 7's page
    page.locator(".jp-Notebook .jp-Cell .cm-content").first.wait_for(timeout=60_000)
    expect(page.locator(".jp-NotebookPanel-toolbar .jp-Toolbar-kernelName")).to_have_text(
        "Python (ivralo)", timeout=60_000
    )
    # The extension's questions plugin has told the server this page shows dialogs: it is loaded.
    expect(page.locator(".jp-NotebookPanel[data-ivralo-dialogs=on]")).to_have_count(1, timeout=30_000)


def test_notebook7_shows_the_effects_line_and_the_dialog_but_no_status_item(page: Any, lab: dict[str, Any]) -> None:
    """One notebook (one page load, one kernel: CI's minutes): the effects line names a file whose
    name is nowhere in the cell's source (built from chr() codes: the line can only have it from the
    kernel's effects report); there is no status bar, so no ivralo item; and the host's egress
    question comes as the extension's dialog, whose "Allow once" lets exactly one request through,
    judged by the loopback server's hit count."""
    name = showcase_shots.EFFECTS_FILE
    codes = ", ".join(str(ord(c)) for c in name)
    httpd, port, hits = counting_person_server()  # serving; hits: each GET's path
    try:
        open_notebook(page, lab, "effects.ipynb")
        expect = playwright.expect
        cells = page.locator(".jp-Notebook .jp-Cell")
        run_in_last_cell(page, f"p = ''.join(map(chr, [{codes}]))\nopen(p, 'w').write('x')\nprint('done')")
        expect(cells.nth(0).locator(".jp-OutputArea-output")).to_have_text("done", timeout=30_000)
        expect(cells.nth(0).locator(".jp-ivralo-Effects-line")).to_contain_text(
            f"ivralo: created {name}", timeout=30_000
        )
        assert cells.nth(0).locator(".jp-OutputArea").inner_text().count(name) == 0, "not an output"
        assert (lab["nbdir"] / name).read_text() == "x"
        # What Notebook 7 shows instead of JupyterLab's status bar: none, and so no ivralo item.
        assert page.locator("#jp-main-statusbar, .jp-StatusBar-Widget").count() == 0
        assert page.locator(".jp-ivralo-SandboxStatus").count() == 0

        run_in_last_cell(
            page, f"import urllib.request\nprint(urllib.request.urlopen('http://localhost:{port}/nb7').status)"
        )
        dialog = page.locator(".jp-Dialog")
        note = untrusted_note(os.path.realpath(lab["nbdir"]))  # the notebooks' folder is not trusted
        expect(dialog).to_contain_text(
            f"Code in this cell wants to reach localhost, this machine, port {port}{note}.", timeout=30_000
        )
        assert cells.nth(1).locator(".jp-Stdin").count() == 0, "a dialog, not the stdin prompt"
        assert hits == [], "nothing before the answer"
        dialog.locator("button", has_text="Allow once").focus()
        page.keyboard.press("Enter")
        expect(cells.nth(1).locator(".jp-OutputArea")).to_contain_text("200", timeout=30_000)
        expect(dialog).to_have_count(0)
        assert hits == ["/nb7"], "the answer let one request through"
    finally:
        httpd.shutdown()
        httpd.server_close()
