"""The write guard, read guard and trust gate, attempt by attempt, with the Landlock floor on and
(forced) off: each row says exactly what happens, and where only the OS-level floor stops an attempt,
the row says so for both modes (the Python-level guard alone does not)."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from kernel_helpers import execute

from ivralo_kernel.host import IvraloKernelManager

OUTSIDE = "outside the workspace"
CLOSED_GIT = ".git/ is closed"
CLOSED_IVRALO = ".ivralo/ holds ivralo's own records"
READ_ENV = ".env files hold credentials"
READ_INTERNALS = "repository internals (.git/) and ivralo's records (.ivralo/) are not readable"
REFUSED = "GuardRefusal"

# (id, code, expected with Landlock on, expected with it off). An expected value is the start of
# what the attempt printed: "ok ..." or "<ExceptionType>: ...", and a fragment of the message.
CASES: list[tuple[str, str, tuple[str, str], tuple[str, str] | None]] = [
    ("open w outside", "open(OUT + '/new.txt', 'w')", (REFUSED, OUTSIDE), None),
    ("os.open O_CREAT outside", "os.open(OUT + '/n2', os.O_WRONLY | os.O_CREAT)", (REFUSED, OUTSIDE), None),
    ("io.FileIO outside", "io.FileIO(OUT + '/n3', 'w')", (REFUSED, OUTSIDE), None),
    ("Path.write_text outside", "Path(OUT, 'n4').write_text('x')", (REFUSED, OUTSIDE), None),
    ("Path.unlink outside", "Path(OUT, 'victim.txt').unlink()", (REFUSED, OUTSIDE), None),
    ("os.remove outside", "os.remove(OUT + '/victim.txt')", (REFUSED, OUTSIDE), None),
    ("rename inside to outside", "os.rename('scratch.txt', OUT + '/moved.txt')", (REFUSED, OUTSIDE), None),
    ("replace outside to inside", "os.replace(OUT + '/victim.txt', 'moved_in.txt')", (REFUSED, OUTSIDE), None),
    ("shutil.copy to outside", "shutil.copy('data.txt', OUT)", (REFUSED, OUTSIDE), None),
    ("shutil.move to outside", "shutil.move('scratch.txt', OUT)", (REFUSED, OUTSIDE), None),
    ("shutil.rmtree outside", "shutil.rmtree(OUT)", (REFUSED, OUTSIDE), None),
    ("mkdir outside", "os.mkdir(OUT + '/d')", (REFUSED, OUTSIDE), None),
    ("makedirs outside", "os.makedirs(OUT + '/a/b')", (REFUSED, OUTSIDE), None),
    ("truncate outside", "os.truncate(OUT + '/victim.txt', 0)", (REFUSED, OUTSIDE), None),
    ("symlink placed outside", "os.symlink(WS + '/data.txt', OUT + '/l')", (REFUSED, OUTSIDE), None),
    ("hard link from outside", "os.link(OUT + '/victim.txt', 'hl')", (REFUSED, "hard-link from"), None),
    ("write through a symlink that points out", "open('link_out/x.txt', 'w')", (REFUSED, OUTSIDE), None),
    ("dot-dot out of the workspace", "open('sub/../../outside/x.txt', 'w')", (REFUSED, OUTSIDE), None),
    ("dot-dot staying inside", "open('sub/../data2.txt', 'w').write('x')", ("ok", "1"), None),
    ("tempfile.mkstemp", "tempfile.mkstemp()[1].startswith(tempfile.gettempdir())", ("ok", "True"), None),
    ("NamedTemporaryFile", "tempfile.NamedTemporaryFile().write(b'x')", ("ok", "1"), None),
    ("sqlite3 database outside", "sqlite3.connect(OUT + '/db.sqlite')", (REFUSED, OUTSIDE), None),
    (
        "sqlite ATTACH outside",
        "sqlite3.connect('in.db').execute(f\"ATTACH DATABASE '{OUT}/att.db' AS a\")"
        " and os.path.exists(OUT + '/att.db')",
        ("OperationalError", "unable to open database"),
        ("ok", "True"),
    ),
    (
        "shell redirection outside",
        "subprocess.run(['sh', '-c', f'echo x > {OUT}/sh.txt'], capture_output=True, text=True).stderr.strip()",
        ("ok", "sh: 1: cannot create"),
        ("ok", ""),
    ),
    (
        "os.open with dir_fd outside",
        "os.open('fd.txt', os.O_WRONLY | os.O_CREAT, dir_fd=os.open(OUT, os.O_RDONLY)) and 'created'",
        ("PermissionError", "[Errno 13] Permission denied"),
        ("ok", "created"),
    ),
    (
        "ctypes creat outside",
        "ctypes.CDLL(None).creat(f'{OUT}/c.txt'.encode(), 0o644) >= 0",
        ("ok", "False"),
        ("ok", "True"),
    ),
    ("append to .git/config", "open('.git/config', 'a')", (REFUSED, CLOSED_GIT), None),
    ("case variant .GIT", "open('.GIT/config', 'w')", (REFUSED, CLOSED_GIT), None),
    ("write into .ivralo", "open('.ivralo/permissions.json', 'w')", (REFUSED, CLOSED_IVRALO), None),
    ("case variant .Ivralo", "open('.Ivralo/x', 'w')", (REFUSED, CLOSED_IVRALO), None),
    ("rewrite .env", "open('.env', 'w')", (REFUSED, "read by ivralo when a kernel starts"), None),
    ("rename into .git/hooks", "os.rename('scratch.txt', '.git/hooks-pre-commit')", (REFUSED, CLOSED_GIT), None),
    ("read .env", "open('.env').read()", (REFUSED, READ_ENV), None),
    ("read sub/.env", "open('sub/.env').read()", (REFUSED, READ_ENV), None),
    ("read a .env outside", "open(OUT + '/.env').read()", (REFUSED, READ_ENV), None),
    ("read .git/config", "open('.git/config').read()", (REFUSED, READ_INTERNALS), None),
    ("list .git", "os.listdir('.git')", (REFUSED, READ_INTERNALS), None),
    ("list .IVRALO", "os.listdir('.IVRALO')", (REFUSED, READ_INTERNALS), None),
    ("enter .git, then read a bare name", "os.chdir('.git') or open('config').read()", (REFUSED, READ_INTERNALS), None),
    ("glob into .git finds nothing", "glob.glob('.git/*')", ("ok", "[]"), None),
    ("symlink to .env", "os.symlink('.env', 'envlink')", (REFUSED, READ_ENV), None),
    # Python's guard lets it by; the fallback's Landlock read floor does not: /tmp is not on its list.
    ("read outside", "open(OUT + '/victim.txt').read()", ("PermissionError:", "Permission denied"), ("ok", "victim")),
    ("list the workspace", "'data.txt' in os.listdir('.')", ("ok", "True"), None),
    ("write inside", "open('new_inside.txt', 'w').write('x')", ("ok", "1"), None),
    ("mkdir inside", "os.mkdir('newdir') or 'made'", ("ok", "made"), None),
    ("import from the untrusted workspace", "__import__('app')", ("TrustGateError", "'app' lives in"), None),
    ("import stdlib", "__import__('json').dumps(1)", ("ok", "1"), None),
    ("open a workspace .py file", "open('app.py').read().strip()", ("ok", "VALUE = 1"), None),
]

SETUP = """
import ctypes, glob, io, os, shutil, sqlite3, subprocess, sys, tempfile
from pathlib import Path
WS, OUT = os.getcwd(), {outside!r}
def attempt(thunk):
    try:
        result = thunk()
        print('ok', '' if result is None else result)
    except BaseException as e:
        print(type(e).__name__ + ':', e)
"""


def make_workspace(root: Path) -> tuple[Path, Path]:
    ws, outside = root / "workspace", root / "outside"
    (ws / "sub").mkdir(parents=True)
    (ws / ".git").mkdir()
    (ws / ".ivralo").mkdir()
    outside.mkdir()
    (ws / "data.txt").write_text("original")
    (ws / "scratch.txt").write_text("scratch")
    (ws / ".env").write_text("GUARDS_TEST_TOKEN=not-for-code\n")
    (ws / "sub" / ".env").write_text("X=1\n")
    (ws / ".git" / "config").write_text("[core]\n")
    (ws / "app.py").write_text("VALUE = 1\n")
    (ws / "link_out").symlink_to(outside)
    (outside / "victim.txt").write_text("victim")
    (outside / ".env").write_text("Y=1\n")
    return ws, outside


@pytest.fixture(params=[True, False], ids=["landlock-on", "landlock-off"], scope="module")
def kernel(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[BlockingKernelClient, bool, Path]]:
    ws, outside = make_workspace(tmp_path_factory.mktemp("guards"))
    # The Python guards and the Landlock floor as they are without the OS sandbox (its fallback mode):
    # inside it, "outside" (under /tmp here) is not even visible. test_sandbox.py covers the sandbox.
    km = IvraloKernelManager.for_settings(workspace=str(ws), landlock=request.param, sandbox="off")
    asyncio.run(km.start_kernel(cwd=str(ws)))
    kc = BlockingKernelClient(**km.get_connection_info(session=True))
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        assert execute(kc, SETUP.format(outside=str(outside))).status == "ok"
        yield kc, request.param, outside
    finally:
        kc.stop_channels()
        asyncio.run(km.shutdown_kernel(now=True))


@pytest.mark.parametrize(("code", "on", "off"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_attempt(
    kernel: tuple[BlockingKernelClient, bool, Path], code: str, on: tuple[str, str], off: tuple[str, str] | None
) -> None:
    kc, landlock, _ = kernel
    kind, fragment = on if landlock or off is None else off
    printed = execute(kc, f"attempt(lambda: {code})").stdout.strip()
    assert printed.startswith(kind), printed
    assert fragment in printed, printed
    if kind == REFUSED:  # said to the person at the notebook: what, why and what they can do; nothing for an agent
        assert "refused" in printed or "ivralo-kernel trust" in printed, printed
        assert "Stop and tell the person" not in printed, printed


def test_nothing_was_written_outside(kernel: tuple[BlockingKernelClient, bool, Path]) -> None:
    _, landlock, outside = kernel
    written = sorted(p.name for p in outside.iterdir())
    holes = {"att.db", "sh.txt", "fd.txt", "c.txt"}  # what only the OS-level floor stops
    assert set(written) - holes == {"victim.txt", ".env"}
    assert (set(written) & holes == set()) if landlock else (set(written) & holes == holes)
    assert (outside / "victim.txt").read_text() == "victim"


def test_layers_say_which_floor_is_in_force(kernel: tuple[BlockingKernelClient, bool, Path]) -> None:
    kc, landlock, _ = kernel
    shown = execute(kc, "print(get_ipython().kernel.kernel_info['ivralo']['layers']['landlock'])").stdout
    assert shown.startswith("ABI ") if landlock else shown.startswith("off")
    assert os.path.exists("/proc/self/task")


REFUSALS = {
    "write": ("open('/etc/ivralo-nope', 'w')", "GuardRefusal: ivralo write guard"),
    "read": ("open('.env')", "GuardRefusal: ivralo read guard"),
}


@pytest.mark.parametrize("what", REFUSALS)
def test_a_refusal_reads_as_the_line_that_tried_and_its_sentence(
    kernel: tuple[BlockingKernelClient, bool, Path], what: str
) -> None:
    """What a notebook shows: the cell's frame, then the error and its sentence; none of ivralo's
    own frames (the guards' code says nothing a person can act on)."""
    kc, _, _ = kernel
    code, error = REFUSALS[what]
    done = execute(kc, code)
    traceback = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(done.reply["content"]["traceback"]))  # no colours
    assert error in traceback, traceback
    assert "ivralo_kernel" not in traceback and "_hooks.py" not in traceback, traceback
    assert "Cell In[" in traceback, traceback
    # A notebook's kernel speaks to the person: the sentence written for an agent is left out.
    assert "refused:" in traceback and "Stop and tell the person" not in traceback, traceback
