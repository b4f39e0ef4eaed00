"""The two closed-path gaps of issue 25 (Must 2), each tried by a shell line, by Python and by ctypes
from a cell, and judged on the host's disk after the cell:

1. a closed name that is a symlink at start (``.vscode -> ../shared-vscode``) can be neither removed
   nor replaced: the host mounts the link over itself from outside (protocol/sandbox/link_mounts.py), and
   code inside still reads the person's settings through it (tests/test_sandbox_as_nobody.py runs
   this file again as an unprivileged user, whose sandbox is a nested user namespace);
2. with the workspace = ``$HOME``, no new top-level entry (``~/.newtool``, ``~/.foorc``) can be made:
   the home folder's top level is read-only inside, and each existing non-dot entry of it is bound
   writable on top (work goes on in the subfolders and in existing files).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from conftest import FALLBACK_KERNEL, SANDBOXED_KERNEL
from kernel_helpers import execute
from sandbox_cases import sh, started_kernel

pytestmark = pytest.mark.timeout(180)

LINK_SH = (
    "rm .vscode && mkdir .vscode && echo x > .vscode/tasks.json; mv .vscode moved; "
    "mkdir -p other; ln -sfn other .vscode; ln -sfnT other .vscode; mv -fT other .vscode; "
    "rm -f .envrc; echo 'echo evil' > .envrc; rm .idea; mkdir .idea; echo x > .idea/workspace.xml;"
    " umount .vscode; umount -l .vscode; cat .vscode/settings.json"
)
LINK_PY = r"""
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
said = {}
def attempt(label, f):
    try:
        f()
        said[label] = "done"
    except Exception as e:
        said[label] = f"{type(e).__name__}: {e}"
def c(name, *args):
    if getattr(libc, name)(*args) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
os.makedirs("decoy", exist_ok=True)
attempt("remove", lambda: os.remove(".vscode"))
attempt("rename away", lambda: os.rename(".vscode", "away"))
attempt("replace by folder", lambda: os.replace("decoy", ".vscode"))
attempt("ctypes unlink", lambda: c("unlink", b".vscode"))
attempt("ctypes rename", lambda: c("rename", b"decoy", b".vscode"))
attempt("ctypes umount2", lambda: c("umount2", b".vscode", 2))
attempt("ctypes unlink envrc", lambda: c("unlink", b".envrc"))
# The calls the supervisor covered the links with are refused to the kernel (its own filter).
said["open_tree"] = libc.syscall(428, -100, b".vscode", 1 | 0x100) >= 0 or os.strerror(ctypes.get_errno())
said["move_mount"] = libc.syscall(429, -100, b"decoy", -100, b".vscode", 0) == 0 or os.strerror(ctypes.get_errno())
said["read through the link"] = open(".vscode/settings.json").read()
print(json.dumps(said))
"""


def test_a_closed_link_cannot_be_removed_or_replaced_and_still_reads_through(tmp_path: Path) -> None:
    """The brief's case: ``.vscode -> ../shared-vscode`` (relative, to a folder of the repository
    around the workspace), ``.envrc``, a link to a file, and ``.idea``, a link out of the workspace
    (here to a folder the sandbox hides: /tmp; the link itself is what is tried)."""
    ws = tmp_path / "repo" / "project"
    shared = ws / "config" / "shared-vscode"
    shared.mkdir(parents=True)
    (shared / "settings.json").write_text('{"the person\'s": 1}\n')
    (ws / "sub").mkdir()
    (ws / ".vscode").symlink_to("config/shared-vscode")
    (ws / "envrc.real").write_text("# the person's\n")
    (ws / ".envrc").symlink_to("envrc.real")
    (tmp_path / "repo" / "outside-idea").mkdir()
    (ws / ".idea").symlink_to("../outside-idea")
    with started_kernel(SANDBOXED_KERNEL, ws) as (_, kc):
        said = sh(kc, LINK_SH)
        done = execute(kc, LINK_PY, timeout=60)
        assert done.status == "ok", (said, [m["content"] for m in done.outputs])
        py = json.loads(done.stdout.strip().splitlines()[-1])
        # Judged on the host's disk while the kernel still runs, and again after it ended.
        during = [os.readlink(ws / name) for name in (".vscode", ".envrc", ".idea")]
    for seen in (during, [os.readlink(ws / name) for name in (".vscode", ".envrc", ".idea")]):
        assert seen == ["config/shared-vscode", "envrc.real", "../outside-idea"], (said, py)
    assert not list((tmp_path / "repo" / "outside-idea").iterdir()), said
    assert sorted(p.name for p in shared.iterdir()) == ["settings.json"], said
    assert (shared / "settings.json").read_text() == '{"the person\'s": 1}\n'
    assert (ws / "envrc.real").read_text() == "# the person's\n", said
    assert not (ws / "moved").exists() and not (ws / "away").exists(), (said, py)
    assert not (ws / "other" / "tasks.json").exists()
    for label in ("remove", "rename away", "replace by folder", "ctypes unlink", "ctypes rename", "ctypes umount2"):
        assert py[label] != "done", (label, py)
    assert py["open_tree"] == py["move_mount"] == "Operation not permitted", py
    # Code inside still reads the person's settings where they keep them, through the link.
    assert py["read through the link"] == '{"the person\'s": 1}\n', py
    assert '{"the person\'s": 1}' in said, said


def test_a_link_changed_while_the_kernel_ran_is_named_in_the_hosts_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What the host says where a closed link was not what it was at start when the kernel ends (here
    the person changed it on the host, outside the sandbox's mount; a link the host could not cover
    is named the same way)."""
    ws = tmp_path / "ws"
    (ws / "editor").mkdir(parents=True)
    (ws / ".vscode").symlink_to("editor")
    with caplog.at_level(logging.WARNING, logger="ivralo_kernel.host.sandbox.closed_paths"):
        with started_kernel(SANDBOXED_KERNEL, ws):
            (ws / ".vscode").unlink()
            (ws / ".vscode").mkdir()
    said = [r.getMessage() for r in caplog.records if "was a link to" in r.getMessage()]
    assert len(said) == 1 and str(ws / ".vscode") in said[0], said


def test_vs_codes_raw_launch_covers_the_closed_links_too(tmp_path: Path) -> None:
    """VS Code runs kernel.json's argv itself: that host builds the sandbox and covers the links as
    the provisioner does (the kernel's start waits for them)."""
    from test_vscode_launch import raw_launch

    ws = tmp_path / "ws"
    (ws / "editor").mkdir(parents=True)
    (ws / "editor" / "settings.json").write_text("{}\n")
    (ws / ".vscode").symlink_to("editor")
    with raw_launch(ws, tmp_path) as kernel:
        said = sh(kernel.client, "rm .vscode; mv .vscode x; mkdir .vscode; cat .vscode/settings.json")
    assert os.readlink(ws / ".vscode") == "editor", said
    assert not (ws / "x").exists() and "{}" in said, said


def test_a_newcomers_fresh_folder_with_a_dangling_closed_link(tmp_path: Path) -> None:
    """A link to nothing yet (``.claude -> agent-settings``): closed where it will point (a
    placeholder there), and the link itself kept."""
    ws = tmp_path / "fresh"
    ws.mkdir()
    (ws / ".claude").symlink_to("agent-settings")
    with started_kernel(SANDBOXED_KERNEL, ws) as (_, kc):
        said = sh(kc, "rm .claude; mkdir .claude; echo '{\"hooks\":1}' > .claude/settings.json; ls -la")
    assert os.readlink(ws / ".claude") == "agent-settings", said
    assert not (ws / "agent-settings").exists(), "the target's placeholder is gone with the kernel"


HOME_SH = (
    "mkdir ~/.newtool && echo x > ~/.newtool/config; echo x > ~/.foorc; echo x > ~/newfile; mkdir ~/newdir;"
    "ln -s /bin/sh ~/.zshenv; echo evil >> ~/.bashrc; rm ~/notes.txt; mv ~/projects ~/moved; mv ~/.bashrc ~/x;"
    "mkdir -p ~/.ssh && echo evil >> ~/.ssh/authorized_keys;"
    # What work needs: the subfolders and the files already there.
    "echo more >> ~/notes.txt; mkdir -p ~/projects/new && echo made > ~/projects/new/out.txt"
)
HOME_PY = r"""
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
home = os.path.expanduser("~")
said = {}
def attempt(label, f):
    try:
        f()
        said[label] = "done"
    except Exception as e:
        said[label] = f"{type(e).__name__}: {e}"
def creat(path):
    fd = libc.open(path.encode(), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    if fd < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    libc.close(fd)
def c(name, *args):
    if getattr(libc, name)(*args) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
attempt("open .pyrc", lambda: open(os.path.join(home, ".pyrc"), "w").write("evil"))
attempt("mkdir .pytool", lambda: os.mkdir(os.path.join(home, ".pytool")))
attempt("open new top file", lambda: open(os.path.join(home, "report.csv"), "w").write("a,b"))
attempt("ctypes creat .crc", lambda: creat(os.path.join(home, ".crc")))
attempt("ctypes mkdir .cdir", lambda: c("mkdir", os.path.join(home, ".cdir").encode(), 0o755))
notes, hidden = (os.path.join(home, n).encode() for n in ("notes.txt", ".notes"))
attempt("ctypes rename notes", lambda: c("rename", notes, hidden))
attempt("write in a subfolder", lambda: open(os.path.join(home, "projects", "py.txt"), "w").write("ok"))
attempt("overwrite a file", lambda: open(os.path.join(home, "projects", "data.csv"), "w").write("new"))
print(json.dumps(said))
"""


@pytest.mark.parametrize("kernel_name", [SANDBOXED_KERNEL, FALLBACK_KERNEL])
def test_with_the_workspace_the_home_folder_no_new_top_level_entry_appears(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel_name: str
) -> None:
    """In the sandbox by its mounts; in the fallback by Landlock, which grants each existing non-dot
    entry of the home folder and not the folder itself (kernel/sandbox/home_top.py)."""
    home = tmp_path / "home"
    (home / "projects").mkdir(parents=True)
    (home / "notes.txt").write_text("the person's\n")
    (home / ".bashrc").write_text("# the person's\n")
    (home / "projects" / "data.csv").write_text("old")
    monkeypatch.setenv("HOME", str(home))
    with started_kernel(kernel_name, home) as (_, kc):
        before = sorted(os.listdir(home))  # the host's own .ivralo and .ipython are there by now
        said = sh(kc, HOME_SH)
        done = execute(kc, HOME_PY, timeout=60)
        assert done.status == "ok", (said, [m["content"] for m in done.outputs])
        py = json.loads(done.stdout.strip().splitlines()[-1])
        during = sorted(os.listdir(home))
    assert during == before, (said, py)
    assert set(before) <= {"projects", "notes.txt", ".bashrc", ".ivralo", ".ipython"}, before
    assert (home / ".bashrc").read_text() == "# the person's\n", said
    # Work goes on: an existing file, and new files in a subfolder.
    assert (home / "notes.txt").read_text() == "the person's\nmore\n", said
    assert (home / "projects" / "new" / "out.txt").read_text() == "made\n", said
    assert py["write in a subfolder"] == "done", py
    # An overwrite is copied to the kernel's history first, in its folder under ~/.ivralo.
    assert py["overwrite a file"] == "done", py
    assert (home / "projects" / "data.csv").read_text() == "new"
    assert any(p.read_bytes() == b"old" for p in (home / ".ivralo" / "history").rglob("*") if p.is_file())
    for label in ("open .pyrc", "mkdir .pytool", "open new top file", "ctypes creat .crc", "ctypes mkdir .cdir"):
        assert py[label] != "done", (label, py)
    assert py["ctypes rename notes"] != "done", py
    # Python is told why and what to do instead.
    assert "new entry at the top of the home folder" in py["open new top file"], py
    assert "Work in a subfolder" in py["open new top file"], py
    left = set(os.listdir(home)) - {"projects", "notes.txt", ".bashrc"}
    assert left <= {".ivralo", ".ipython"}, f"left behind: {sorted(left)}"


@pytest.mark.fast
def test_the_supervisor_reads_covered_links_from_the_mount_table(tmp_path: Path) -> None:
    """What the supervisor waits on: a link's mount point in mountinfo (escaped as Linux writes it),
    and the host's list, refused unless it is absolute paths."""
    from ivralo_kernel.protocol.sandbox.link_mounts import mount_points, parse

    table = tmp_path / "mountinfo"
    table.write_text(
        "47 163 254:0 /w/.vscode /w/.vscode rw,relatime - ext4 /dev/vda rw\n"
        "48 163 254:0 /w/a\\040b /w/a\\040b rw,relatime - ext4 /dev/vda rw\n"
    )
    assert mount_points(str(table)) == {"/w/.vscode", "/w/a b"}
    assert parse('["/w/.vscode"]') == ["/w/.vscode"]
    for bad in ('["relative"]', '{"a": 1}', "[1]"):
        with pytest.raises(ValueError):
            parse(bad)


@pytest.mark.fast
def test_the_fallbacks_grants_leave_out_the_home_folders_top_level(tmp_path: Path) -> None:
    """kernel/sandbox/home_top.py: with the workspace = /home-like folder holding $HOME deeper down, each level
    on the way keeps its top; the home folder's non-dot entries are granted, its dot-entries and
    links are not; the kernel's own history folder is."""
    from ivralo_kernel.kernel.sandbox.home_top import write_grants

    ws = tmp_path / "home"
    me = ws / "me"
    (ws / "other").mkdir(parents=True)
    (ws / "file.txt").write_text("")
    for name in ("projects", ".config", ".ivralo/history"):
        (me / name).mkdir(parents=True)
    (me / "notes.txt").write_text("")
    (me / ".bashrc").write_text("")
    (me / "data").symlink_to("/etc")
    own = (str(me / ".ivralo" / "history"), str(me / ".ivralo" / "missing.log"))
    folders, files = write_grants(str(ws), str(me), own)
    assert set(folders) == {str(ws / "other"), str(me / "projects"), str(me / ".ivralo" / "history")}
    assert set(files) == {str(ws / "file.txt"), str(me / "notes.txt")}
    assert write_grants(str(me), str(me)) == ((str(me / "projects"),), (str(me / "notes.txt"),))
