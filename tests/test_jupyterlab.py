"""What a person sees in real JupyterLab, in headless Chromium: "Python (ivralo)" in the launcher,
a cell that runs, and a cell killed at its deadline that says why and leaves a fresh kernel behind.

Recipe: ../shared/notes/test-infrastructure.md §1 (Debian's chromium driven by Playwright through
``executable_path``; nothing is downloaded; the server listens on 127.0.0.1 only).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import showcase_shots
from servers import counting_person_server, jupyter_server

from ivralo_kernel.cli.install import install
from ivralo_kernel.host.sandbox.egress import untrusted_note

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
playwright = pytest.importorskip("playwright.sync_api")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM) and not os.environ.get("CI"),
        reason="Debian's chromium is not installed (apt-get install -y chromium); .ci/run installs it",
    ),
]
TOKEN = uuid.uuid4().hex
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DEADLINE_MS = showcase_shots.DEADLINE_MS


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("lab")
    prefix = Path(os.environ["JUPYTER_PATH"]).parents[1]
    install(
        prefix=str(prefix),
        name="ivralo-lab-deadline",
        display_name="Python (ivralo, 2 s deadline)",
        provisioner_config={"deadline_ms": DEADLINE_MS, "interrupt_grace_ms": 500},
    )
    install(
        prefix=str(prefix),
        name="ivralo-lab-broker",
        display_name="Python (ivralo, databases)",
        provisioner_config={"grants": ["databases"]},
    )
    settings = Path(os.environ["JUPYTER_CONFIG_DIR"]) / "lab/user-settings/@jupyterlab/apputils-extension"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    nbdir = root / "notebooks"
    nbdir.mkdir()
    lab_args = (
        "--no-browser", "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
    )  # fmt: skip
    with jupyter_server("jupyterlab", nbdir, TOKEN, *lab_args) as url:
        yield {"url": url, "nbdir": nbdir, "root": root}


@pytest.fixture(scope="module")
def browser(lab: dict[str, Any]) -> Iterator[Any]:
    home = lab["root"] / "browser-home"
    home.mkdir()
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, env={**os.environ, "HOME": str(home)})
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any, lab: dict[str, Any]) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    off_loopback: list[str] = []
    page.on("request", lambda r: off_loopback.append(r.url) if not r.url.startswith(lab["url"]) else None)
    try:
        yield page
    finally:
        context.close()
    assert [u for u in off_loopback if not u.startswith(("data:", "blob:"))] == []


def open_notebook(page: Any, lab: dict[str, Any], name: str, kernel: str, display: str) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": kernel, "language": "python", "display_name": display}
    nb.cells.append(nbformat.v4.new_code_cell(""))
    nbformat.write(nb, lab["nbdir"] / name)
    expect = playwright.expect
    page.goto(f"{lab['url']}/lab/workspaces/{name.removesuffix('.ipynb')}/tree/{name}?token={TOKEN}")
    expect(page.locator(".lm-DockPanel-tabBar .lm-mod-current .lm-TabBar-tabLabel")).to_have_text(name, timeout=60_000)
    page.locator(".jp-Notebook .jp-Cell .cm-content").first.wait_for(timeout=60_000)
    expect(page.locator(".jp-Toolbar-kernelName")).to_have_text(display, timeout=60_000)
    expect(page.locator("#jp-main-statusbar")).to_contain_text(f"{display} | Idle", timeout=60_000)


def shoot(page: Any, name: str, *areas: Any) -> None:
    """Screenshot the cells ``areas`` (one picture around all of them) into docs/images/NAME, after
    checking they show every fragment showcase_shots says the image shows; then record it in the
    manifest that tests/test_docs.py checks the README's images against."""
    fragments = showcase_shots.shows(name)
    shown = "\n".join(area.inner_text() for area in areas)
    missing = [fragment for fragment in fragments if fragment not in shown]
    assert not missing, f"{name}: not shown {missing} in {shown!r}"
    boxes = [area.bounding_box() for area in areas]
    left, top = min(b["x"] for b in boxes), min(b["y"] for b in boxes)
    right, bottom = max(b["x"] + b["width"] for b in boxes), max(b["y"] + b["height"] for b in boxes)
    pad = 8
    clip = {
        "x": max(left - pad, 0),
        "y": max(top - pad, 0),
        "width": right - left + 2 * pad,
        "height": bottom - top + 2 * pad,
    }
    page.mouse.move(0, 0)  # no hover highlight in the picture
    # The committed picture is replaced only when it is stale (or IVRALO_UPDATE_SCREENSHOTS is set):
    # screenshots differ byte for byte between runs, and a test run should not dirty the checkout.
    target = showcase_shots.IMAGES / name
    entry = showcase_shots.read_manifest().get(name, {})
    current = target.exists() and entry.get("shows") == fragments
    current = current and entry.get("png_sha256") == showcase_shots.sha256(target)
    keep = current and not os.environ.get("IVRALO_UPDATE_SCREENSHOTS")
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / name if keep else target
        target.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(path), clip=clip, animations="disabled", caret="hide")
        assert path.stat().st_size > 0
    if not keep:
        showcase_shots.record(name, fragments)


def run_in_last_cell(page: Any, code: str) -> None:
    page.locator(".jp-Notebook .jp-Cell-inputArea .cm-content").last.click()
    page.keyboard.type(code)
    page.keyboard.press("Shift+Enter")


def test_launcher_offers_the_ivralo_kernel(page: Any, lab: dict[str, Any]) -> None:
    page.goto(f"{lab['url']}/lab/workspaces/launcher?token={TOKEN}")
    card = page.locator('.jp-LauncherCard[data-category="Notebook"][title="Python (ivralo)"]')
    card.wait_for(timeout=60_000)
    page.screenshot(path=str(lab["root"] / "launcher.png"))


def test_a_cell_runs_and_a_killed_cell_says_why(page: Any, lab: dict[str, Any]) -> None:
    display = "Python (ivralo, 2 s deadline)"
    open_notebook(page, lab, "deadline.ipynb", "ivralo-lab-deadline", display)
    expect = playwright.expect
    cells = page.locator(".jp-Notebook .jp-Cell")
    run_in_last_cell(page, "x = 6 * 7\nprint(x)")
    expect(cells.nth(0).locator(".jp-OutputArea-output")).to_have_text("42", timeout=30_000)
    run_in_last_cell(page, "while True: pass")
    expect(cells.nth(1).locator(".jp-OutputArea-output")).to_contain_text(
        f"interrupted: exceeded deadline_ms={DEADLINE_MS}; namespace preserved", timeout=30_000
    )
    run_in_last_cell(page, "import time\ntime.sleep(0.2)\nsum(range(10**11))")
    expect(cells.nth(2).locator(".jp-OutputArea-output")).to_contain_text(
        f"ivralo ended this cell's kernel (timeout: execution exceeded deadline_ms={DEADLINE_MS}", timeout=30_000
    )
    expect(cells.nth(2).locator(".jp-InputPrompt")).not_to_have_text("[*]:", timeout=30_000)
    expect(page.locator("#jp-main-statusbar")).to_contain_text(f"{display} | Idle", timeout=30_000)
    shoot(page, "deadline-kill.png", cells.nth(1), cells.nth(2))
    run_in_last_cell(page, "print('x' in dir())")
    expect(cells.nth(3).locator(".jp-OutputArea-output")).to_have_text("False", timeout=30_000)
    assert page.locator(".jp-Dialog").count() == 0, "no 'kernel died' dialog"


def test_a_refusal_shows_the_cells_line_and_one_sentence(page: Any, lab: dict[str, Any]) -> None:
    """What JupyterLab renders for a refused open(): the cell's frame, then the error and its
    sentence, written for the person; none of ivralo's own frames."""
    open_notebook(page, lab, "refusal.ipynb", "ivralo", "Python (ivralo)")
    expect = playwright.expect
    run_in_last_cell(page, "x = 1\nopen('/etc/ivralo-nope', 'w')")
    output = page.locator(".jp-Notebook .jp-Cell").nth(0).locator(".jp-OutputArea-output")
    expect(output).to_contain_text(
        "GuardRefusal: ivralo write guard: open for writing '/etc/ivralo-nope' refused: it is outside the workspace",
        timeout=30_000,
    )
    shoot(page, "refusal.png", page.locator(".jp-Notebook .jp-Cell").nth(0))
    shown = output.inner_text()
    assert "Cell In[1], line 2" in shown, shown
    assert "open('/etc/ivralo-nope', 'w')" in shown, shown
    assert "_hooks.py" not in shown and "ivralo_kernel" not in shown, shown  # no frame of ours
    assert "Stop and tell the person" not in shown, shown  # that sentence is for an agent
    assert shown.rstrip().endswith("Write inside the workspace."), shown


def test_the_person_is_asked_about_an_unknown_host(page: Any, lab: dict[str, Any]) -> None:
    """A page without the extension's dialogs (its registration is cut off here, as a frontend
    without the extension never makes it): the question appears where input() would; the answer is
    relayed to the host; the time the person takes (longer than the 2 s deadline here) does not count
    against the deadline."""
    httpd, port, hits = counting_person_server()  # judged where the request lands, not by what the cell prints
    # Nothing is allowed in advance: a fresh folder, as a newcomer has it.
    try:
        display = "Python (ivralo, 2 s deadline)"
        page.route(re.compile(r".*/ivralo/kernels/[^/]+/dialogs"), lambda route: route.abort())
        open_notebook(page, lab, "ask.ipynb", "ivralo-lab-deadline", display)
        expect = playwright.expect
        cells = page.locator(".jp-Notebook .jp-Cell")
        run_in_last_cell(
            page, f"import urllib.request\nprint(urllib.request.urlopen('http://localhost:{port}/').status)"
        )
        stdin = cells.nth(0).locator(".jp-Stdin")
        note = untrusted_note(os.path.realpath(lab["nbdir"]))  # the notebooks' folder is not trusted
        expect(stdin).to_contain_text(
            f"Code in this cell wants to reach localhost, this machine, port {port}{note}. Allow? [yes/no]",
            timeout=30_000,
        )
        page.wait_for_timeout(DEADLINE_MS + 1000)  # the person reads the question: longer than the deadline
        stdin.locator("input").fill("yes")
        stdin.locator("input").press("Enter")
        output = cells.nth(0).locator(".jp-OutputArea")
        expect(output).to_contain_text("200", timeout=30_000)
        expect(output).to_contain_text("[ivralo network: localhost allowed until this kernel restarts]", timeout=30_000)
        expect(output).not_to_contain_text("interrupted")
        shoot(page, "egress-question.png", cells.nth(0))
        assert hits == ["/"], "the person's yes reached the server once, with nothing allowed before"
        # ...through the OS sandbox's egress proxy: the kernel has no network of its own.
        run_in_last_cell(page, "print(get_ipython().kernel.kernel_info['ivralo']['layers']['sandbox'][:5])")
        expect(cells.nth(1).locator(".jp-OutputArea-output")).to_have_text("bwrap", timeout=30_000)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_person_says_no_to_a_subprocess(page: Any, lab: dict[str, Any]) -> None:
    """``!curl`` in a cell goes through the sandbox's proxy: the host's question as the extension's
    dialog (labextension/src/questions.ts), answered from the keyboard: Escape is Deny; "no" reaches
    nothing (judged by the server's request log)."""
    httpd, port, hits = counting_person_server()  # serving; hits: each GET's path
    try:
        open_notebook(page, lab, "ask-no.ipynb", "ivralo-lab-deadline", "Python (ivralo, 2 s deadline)")
        expect = playwright.expect
        expect(page.locator(".jp-NotebookPanel[data-ivralo-dialogs=on]")).to_have_count(1, timeout=30_000)
        cells = page.locator(".jp-Notebook .jp-Cell")
        run_in_last_cell(page, f"!curl -sS http://localhost:{port}/from-curl")
        dialog = page.locator(".jp-Dialog")
        note = untrusted_note(os.path.realpath(lab["nbdir"]))  # the notebooks' folder is not trusted
        expect(dialog).to_contain_text(
            f"Code in this cell wants to reach localhost, this machine, port {port}{note}.", timeout=30_000
        )
        buttons = dialog.locator(".jp-Dialog-footer button")
        expect(buttons).to_have_text(["Deny", "Allow once"])  # no "always": the folder is not trusted
        assert cells.nth(0).locator(".jp-Stdin").count() == 0, "a dialog, not the stdin prompt"
        page.keyboard.press("Escape")
        output = cells.nth(0).locator(".jp-OutputArea")
        expect(output).to_contain_text("ivralo refused localhost", timeout=30_000)
        expect(output).to_contain_text("[ivralo network: localhost refused (the person said no)]", timeout=30_000)
        assert hits == [], "the person's no let nothing through"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_host_asks_in_a_dialog_and_allow_once_lets_one_request_through(page: Any, lab: dict[str, Any]) -> None:
    """The extension's dialog, from the host (the page fetches the host's open question from the
    server extension and answers it there: it never passes through the kernel); "Allow once" chosen
    from the keyboard; judged by the loopback server's hit count."""
    httpd, port, hits = counting_person_server()  # serving; hits: each GET's path
    try:
        open_notebook(page, lab, "ask-dialog.ipynb", "ivralo-lab-deadline", "Python (ivralo, 2 s deadline)")
        expect = playwright.expect
        expect(page.locator(".jp-NotebookPanel[data-ivralo-dialogs=on]")).to_have_count(1, timeout=30_000)
        cells = page.locator(".jp-Notebook .jp-Cell")
        run_in_last_cell(
            page, f"import urllib.request\nprint(urllib.request.urlopen('http://localhost:{port}/once').status)"
        )
        dialog = page.locator(".jp-Dialog")
        expect(dialog).to_contain_text(f"wants to reach localhost, this machine, port {port}", timeout=30_000)
        assert hits == [], "nothing before the answer"
        shoot(page, "egress-dialog.png", dialog.locator(".jp-Dialog-content"))
        dialog.locator("button", has_text="Allow once").focus()
        page.keyboard.press("Enter")
        output = cells.nth(0).locator(".jp-OutputArea")
        expect(output).to_contain_text("200", timeout=30_000)
        expect(output).to_contain_text("[ivralo network: localhost allowed until this kernel restarts]")
        expect(dialog).to_have_count(0)
        assert hits == ["/once"], "the answer let one request through"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_a_brokered_call_shows_its_record_line(page: Any, lab: dict[str, Any]) -> None:
    """A query through the credential broker, from a kernel granted "databases": the rows, then the
    line that records the call by the credential's name. The database is the workspace's own (a
    SQLite file named in its databases.json, its URL in its .env, which the kernel cannot read)."""
    import sqlite3

    nbdir = lab["nbdir"]
    with sqlite3.connect(nbdir / "shop.db") as db:
        db.execute("create table if not exists items (name text primary key, price real)")
        db.executemany("insert or replace into items values (?, ?)", [("tea", 3.5), ("scone", 2.8), ("bagel", 2.2)])
    (nbdir / "databases.json").write_text(json.dumps({"shop": {"url_env": showcase_shots.DB_CREDENTIAL}}))
    (nbdir / ".env").write_text(f"{showcase_shots.DB_CREDENTIAL}=sqlite:///{nbdir / 'shop.db'}\n")
    open_notebook(page, lab, "broker.ipynb", "ivralo-lab-broker", "Python (ivralo, databases)")
    expect = playwright.expect
    cells = page.locator(".jp-Notebook .jp-Cell")
    run_in_last_cell(page, 'print(*ivralo.sql("shop", "select name, price from items where price < 3"), sep="\\n")')
    output = cells.nth(0).locator(".jp-OutputArea")
    expect(output).to_contain_text("{'name': 'bagel', 'price': 2.2}", timeout=30_000)
    expect(output).to_contain_text("[ivralo answered this code's calls: shop database with", timeout=30_000)
    shoot(page, "record-line.png", cells.nth(0))


def test_the_status_bar_shows_the_hosts_facts(page: Any, lab: dict[str, Any]) -> None:
    """The extension's status bar item (labextension/src/status.ts): sandboxed, the deadline and the
    memory limit, from the host's provisioner (host/jupyter/lab_server.py), not from kernel_info; a
    click says what this mode does not stop, in the words of protocol/sandbox/modes.py."""
    from ivralo_kernel.protocol.policy import default_memory_limit
    from ivralo_kernel.protocol.sandbox.modes import SANDBOX_GAPS

    display = "Python (ivralo, 2 s deadline)"
    open_notebook(page, lab, "status.ipynb", "ivralo-lab-deadline", display)
    expect = playwright.expect
    item = page.locator("#jp-main-statusbar .jp-ivralo-SandboxStatus")
    memory = f"{default_memory_limit() / (1 << 30):.1f} GiB"
    expect(item).to_have_text(f"ivralo: sandboxed · deadline 2 s · memory {memory}", timeout=30_000)
    item.click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("OS sandbox (bubblewrap)", timeout=10_000)
    expect(dialog).to_contain_text(f"Not stopped in this mode: {SANDBOX_GAPS}.")
    shoot(page, "sandbox-status.png", dialog.locator(".jp-Dialog-content"), item)
    page.keyboard.press("Escape")
    expect(dialog).to_have_count(0, timeout=10_000)


def test_each_cells_effects_show_beside_it_and_are_not_saved(page: Any, lab: dict[str, Any]) -> None:
    """The effects line (labextension/src/effects.ts), under the cell's input and not an output: it
    names a file the cell wrote whose name is nowhere in the cell's source (it is built from chr()
    codes, so the line can only have it from the kernel's effects report); quiet for a cell that did
    nothing notable; expandable; and absent from the saved .ipynb."""
    name = showcase_shots.EFFECTS_FILE
    codes = ", ".join(str(ord(c)) for c in name)
    open_notebook(page, lab, "effects.ipynb", "ivralo", "Python (ivralo)")
    expect = playwright.expect
    cells = page.locator(".jp-Notebook .jp-Cell")
    run_in_last_cell(page, f"p = ''.join(map(chr, [{codes}]))\nopen(p, 'w').write('x')\nprint('done')")
    expect(cells.nth(0).locator(".jp-OutputArea-output")).to_have_text("done", timeout=30_000)
    line = cells.nth(0).locator(".jp-ivralo-Effects")
    expect(line.locator(".jp-ivralo-Effects-line")).to_contain_text(f"ivralo: created {name}", timeout=30_000)
    expect(line.locator(".jp-ivralo-Effects-details")).to_be_hidden()
    line.locator(".jp-ivralo-Effects-line").click()
    expect(line.locator(".jp-ivralo-Effects-details")).to_contain_text(f"created: {name}")
    assert cells.nth(0).locator(".jp-OutputArea").inner_text().count(name) == 0, "not an output"
    run_in_last_cell(page, "x = 1")
    expect(cells.nth(1).locator(".jp-InputPrompt")).to_have_text("[2]:", timeout=30_000)
    expect(cells.nth(1).locator(".jp-ivralo-Effects")).to_be_hidden()  # quiet: nothing notable
    # A changed file's Restore: through the server extension and the host's history, not the kernel.
    kept = lab["nbdir"] / showcase_shots.EFFECTS_KEPT
    kept.write_text("before")
    run_in_last_cell(page, f"open({kept.name!r}, 'w').write('after')")
    changed = cells.nth(2).locator(".jp-ivralo-Effects")
    expect(changed.locator(".jp-ivralo-Effects-line")).to_contain_text(f"ivralo: changed {kept.name}", timeout=30_000)
    changed.locator(".jp-ivralo-Effects-line").click()
    assert kept.read_text() == "after"
    changed.locator(".jp-ivralo-Effects-restore").click()
    expect(changed.locator(".jp-ivralo-Effects-note")).to_contain_text(f"Restored {kept.name}", timeout=30_000)
    assert kept.read_text() == "before"
    shoot(page, "effects-line.png", cells.nth(0), cells.nth(2))
    page.keyboard.press("Control+s")
    saved = lab["nbdir"] / "effects.ipynb"
    expect(page.locator(".lm-DockPanel-tabBar .lm-mod-current.jp-mod-dirty")).to_have_count(0, timeout=30_000)
    assert "done" in saved.read_text(), saved.read_text()  # saved, with the cell's outputs
    assert name not in saved.read_text(), "the effects line is not saved into the notebook"
    assert "Restored" not in saved.read_text()
    assert (lab["nbdir"] / name).read_text() == "x"
