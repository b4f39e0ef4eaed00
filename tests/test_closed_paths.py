"""Closed paths are closed whether they exist at start or not (issue 25): ``.git``, ``.ivralo``,
``databases.json``, every tool file other programs run by themselves, and with the workspace = $HOME
every dot-entry there. Each is tried by a shell line, by Python and by ctypes (create, write, rename
over, replace by a symlink) and judged on disk from the test; the placeholders that close missing
ones must not disturb the person's own git, and must be gone when the last kernel ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import SANDBOXED_KERNEL
from kernel_helpers import execute
from sandbox_cases import sh, started_kernel

from ivralo_kernel.host.sandbox.closed_paths import TOOL_FILES_DEFAULT

CLOSED = (".git", ".ivralo", "databases.json", *TOOL_FILES_DEFAULT)
FOLDERS = {".git", ".ivralo", ".vscode", ".idea", ".claude", ".cursor", ".zed", ".devcontainer", ".github"}
FOLDERS |= {".husky", ".githooks", ".gemini", ".windsurf", ".continue"}
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}

# Every way in, for each closed name: make it, write it, write under it, rename a file and a folder
# over it, remove it and put a symlink there. "decoy" is an ordinary folder of the workspace.
SH_ATTACK = r"""
for p in {names}; do
  mkdir -p "$p/sub"; echo evil > "$p/sub/evil"; echo evil > "$p/evil"; echo evil > "$p"; echo evil >> "$p"
  echo evil > x.tmp; mv -f x.tmp "$p"; rm -f x.tmp
  mkdir -p x.d; echo evil > x.d/evil; mv -fT x.d "$p"; rm -rf x.d
  mv "$p" "$p.moved"; rm -rf "$p"; ln -sfn "$PWD/decoy" "$p"; ln -s "$PWD/decoy" "$p/link"
done
G=git; "$G" init -q . ; git config core.fsmonitor 'echo evil'
"""
# ("$G": the write guard refuses a `git init` it can read on the line; the OS is what is tried here.)
PY_ATTACK = r"""
import ctypes, json, os, shutil
libc = ctypes.CDLL(None, use_errno=True)
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
    libc.write(fd, b"evil", 4)
    libc.close(fd)
def c_call(name, *args):
    if getattr(libc, name)(*(a.encode() for a in args)) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
for p in NAMES:
    attempt(p + " makedirs", lambda: os.makedirs(os.path.join(p, "sub"), exist_ok=True))
    attempt(p + " open under", lambda: open(os.path.join(p, "evil"), "w").write("evil"))
    attempt(p + " open", lambda: open(p, "w").write("evil"))
    attempt(p + " append", lambda: open(p, "a").write("evil"))
    open("y.tmp", "w").write("evil")
    attempt(p + " replace", lambda: os.replace("y.tmp", p))
    os.makedirs("y.d", exist_ok=True)
    attempt(p + " replace folder", lambda: os.replace("y.d", p))
    attempt(p + " move away", lambda: os.rename(p, p + ".moved"))
    attempt(p + " rmtree", lambda: shutil.rmtree(p) if os.path.isdir(p) else os.remove(p))
    attempt(p + " symlink", lambda: os.symlink(os.path.abspath("decoy"), p))
    attempt(p + " ctypes mkdir", lambda: c_call("mkdir", p + "/csub") if libc.mkdir(p.encode(), 0o755) else None)
    attempt(p + " ctypes creat", lambda: creat(p + "/cevil"))
    attempt(p + " ctypes creat file", lambda: creat(p))
    open("z.tmp", "w").write("evil")
    attempt(p + " ctypes rename", lambda: c_call("rename", "z.tmp", p))
    attempt(p + " ctypes symlink", lambda: c_call("symlink", os.path.abspath("decoy"), p))
print(json.dumps(said))
"""


def snapshot(path: Path) -> object:
    """What is at ``path``, as the host sees it: nothing, a link, a file's bytes, or a folder's tree."""
    if path.is_symlink():
        return ("link", os.readlink(path))
    if path.is_file():
        return ("file", path.read_bytes())
    if path.is_dir():
        return ("dir", sorted((str(p.relative_to(path)), snapshot(p)) for p in path.iterdir()))
    return None if not path.exists() else ("other",)


def existing(ws: Path) -> None:
    """Every closed path made before the kernel starts, with content a tool would read."""
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    for name in CLOSED:
        path = ws / name
        if name in FOLDERS:
            path.mkdir(exist_ok=True)
            (path / "settings.json").write_text(f'{{"the person\'s": "{name}"}}\n')
        else:
            path.write_text(f"# the person's {name}\n")
    (ws / ".claude" / "commands").mkdir()
    (ws / ".claude" / "commands" / "review.md").write_text("the person's command\n")
    (ws / ".github" / "workflows").mkdir()
    (ws / ".github" / "workflows" / "ci.yml").write_text("on: push\n")


def attack(kc: object, names: tuple[str, ...]) -> tuple[str, dict[str, str]]:
    said = sh(kc, SH_ATTACK.format(names=" ".join(names)))  # type: ignore[arg-type]
    done = execute(kc, f"NAMES = {list(names)!r}\n" + PY_ATTACK, timeout=60)  # type: ignore[arg-type]
    assert done.status == "ok", done.outputs
    return said, json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("at_start", ["missing", "existing"])
def test_closed_paths_stay_closed_to_sh_python_and_ctypes(workspace: Path, at_start: str) -> None:
    ws = workspace
    (ws / "decoy").mkdir()
    if at_start == "existing":
        existing(ws)
    before = {name: snapshot(ws / name) for name in CLOSED}
    with started_kernel(SANDBOXED_KERNEL, ws) as (_, kc):
        said, py = attack(kc, CLOSED)
        during = {name: snapshot(ws / name) for name in CLOSED}
    for name in CLOSED:
        if name == ".ivralo":  # the host's own records (made before every start): nothing the kernel tried
            assert not (ws / name / "permissions.json").exists(), (said, py)
            assert not list((ws / name).rglob("evil")), (said, py)
        elif before[name] is None:  # the placeholder: an empty folder, read-only inside, gone afterwards
            # (databases.json: an empty file, which the person can fill on the host while a kernel runs)
            placeholder = ("file", b"") if name == "databases.json" else ("dir", [])
            assert during[name] == placeholder, (name, during[name], said, py)
            assert not (ws / name).exists() and not (ws / name).is_symlink(), f"{name}'s placeholder stayed"
        else:
            assert during[name] == before[name], (name, said, py)
            assert snapshot(ws / name) == before[name], name
    assert not list((ws / "decoy").iterdir()), "nothing went through a link into the decoy"
    assert not list(ws.glob("*.moved")), "no closed path was moved away"
    # The friendly refusal: Python is told why, by the write guard, before the OS says no.
    assert "closed: other tools" in py[".vscode open under"], py[".vscode open under"]
    assert "run `git init` outside the kernel" in py[".git makedirs"], py[".git makedirs"]


def test_a_closed_entry_that_is_a_symlink_is_closed_at_its_target(workspace: Path) -> None:
    ws = workspace
    (ws / "editor").mkdir()
    (ws / "editor" / "tasks.json").write_text('{"the person\'s": 1}\n')
    (ws / ".vscode").symlink_to("editor")
    (ws / ".claude").symlink_to("agent-settings")  # points to nothing yet: closed where it will be
    before = snapshot(ws / "editor")
    with started_kernel(SANDBOXED_KERNEL, ws) as (_, kc):
        said = sh(
            kc,
            "echo evil > .vscode/tasks.json; echo evil > editor/tasks.json; echo evil > editor/settings.json;"
            "mkdir -p agent-settings; echo evil > agent-settings/settings.json; echo evil > .claude/settings.json",
        )
        done = execute(
            kc,
            "import os\nfor f in (lambda: open('editor/tasks.json', 'w'), lambda: os.remove('.vscode')):\n"
            "    try:\n        f()\n    except OSError as e:\n        print(e)",
        )
    assert snapshot(ws / "editor") == before, said
    assert not (ws / "agent-settings" / "settings.json").exists(), said
    assert not (ws / "agent-settings").exists(), "the target's placeholder is gone with the kernel"
    assert os.readlink(ws / ".claude") == "agent-settings"
    assert done.stdout.count("closed: other tools") == 2, done.stdout  # the target, and the link itself
    assert (ws / ".vscode").is_symlink()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """The person's repository, with a commit; the workspace will be a subfolder of it."""
    repo = tmp_path / "repo"
    (repo / "analysis").mkdir(parents=True)
    (repo / "analysis" / "notes.txt").write_text("tracked\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", "init"], check=True, env={**os.environ, **GIT_ENV})
    return repo


def person_runs_git_status(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "status", "--porcelain"], cwd=folder, capture_output=True, text=True, timeout=30)


def test_no_new_git_in_the_workspace_folder_when_it_is_a_subfolder_of_a_repository(repo: Path, tmp_path: Path) -> None:
    ws = repo / "analysis"
    marker = tmp_path / "fsmonitor-ran"
    # The control: the same two commands, run by the person, make git run the fsmonitor (the test can fail).
    control = repo / "control"
    control.mkdir()
    fsmonitor = f"touch {marker}.control"
    subprocess.run(["sh", "-c", f"git init -q . && git config core.fsmonitor '{fsmonitor}'"], cwd=control, check=True)
    person_runs_git_status(control)
    assert Path(f"{marker}.control").exists(), "this git runs core.fsmonitor: the attack is real"
    status_before = person_runs_git_status(ws)
    with started_kernel(SANDBOXED_KERNEL, ws) as (_, kc):
        said = sh(kc, f"G=git; $G init . && git config core.fsmonitor 'touch {marker}'; printf 'gitdir: x' > .git")
        done = execute(kc, "import os\ntry:\n    os.mkdir('.git/hooks')\nexcept OSError as e:\n    print(e)")
        bang = execute(kc, "!git init")  # IPython's shell line: refused before git runs, with the sentence
        during = person_runs_git_status(ws)  # the person's git, while the kernel runs
        # The workspace folder itself as a bare repository (HEAD, objects/, refs/, config): git's
        # discovery would take it before the person's repository above (its files but HEAD land: inert).
        said += sh(kc, "G=git; $G init -q --bare . ; git config core.pager 'touch " + str(marker) + "'; ls")
        git_dir = subprocess.run(["git", "rev-parse", "--absolute-git-dir"], cwd=ws, capture_output=True, text=True)
    after = person_runs_git_status(ws)
    assert not marker.exists(), said
    assert git_dir.stdout.strip() == str(repo / ".git"), (git_dir, said)
    assert during.returncode == 0 and after.returncode == 0, (during.stderr, after.stderr)
    # .ivralo (the host's records) and the empty databases.json placeholder (a file, for the person to
    # fill while a kernel runs) show as untracked; nothing else the kernel did does.
    strip = [line for line in during.stdout.splitlines() if ".ivralo" not in line and "databases.json" not in line]
    assert strip == [line for line in status_before.stdout.splitlines() if ".ivralo" not in line], during.stdout
    assert not (ws / ".git").exists(), "the placeholder is gone, and no .git came in its place"
    assert "run `git init` outside the kernel" in done.stdout, done.stdout
    assert any("run `git init` outside the kernel" in str(o["content"].get("evalue")) for o in bang.outputs), bang


def test_a_repository_cloned_into_a_subfolder_still_works(workspace: Path) -> None:
    origin = workspace / "origin"
    origin.mkdir()
    (origin / "README").write_text("hello\n")
    subprocess.run(["git", "init", "-q", str(origin)], check=True)
    subprocess.run(["git", "-C", str(origin), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(origin), "commit", "-qm", "first"], check=True, env={**os.environ, **GIT_ENV})
    with started_kernel(SANDBOXED_KERNEL, workspace) as (_, kc):
        said = sh(
            kc,
            "git clone -q origin sub/clone && cd sub/clone && echo more >> README &&"
            " git -c user.name=k -c user.email=k@k commit -qam from-the-kernel && echo committed",
        )
    assert "committed" in said, said
    log = subprocess.run(["git", "-C", str(workspace / "sub" / "clone"), "log", "--format=%s"], capture_output=True)
    assert log.stdout.decode().split() == ["from-the-kernel", "first"], log


def test_with_the_workspace_the_home_folder_every_dot_entry_stays_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("# the person's\n")
    (home / ".profile").write_text("echo PROFILE-RAN\n")
    monkeypatch.setenv("HOME", str(home))
    before = sorted(os.listdir(home))
    evil_ls = "#!/bin/sh\necho evil\n"
    git_alone = subprocess.run(["git", "config", "--global", "--list"], capture_output=True, text=True, timeout=30)
    with started_kernel(SANDBOXED_KERNEL, home) as (_, kc):
        said = sh(
            kc,
            "mkdir -p .ssh; echo ssh-ed25519 AAAA evil >> .ssh/authorized_keys; echo evil > .ssh/rc;"
            f"echo evil >> .bashrc; mkdir -p .local/bin; printf '{evil_ls}' > .local/bin/ls; chmod +x .local/bin/ls;"
            "echo evil > .bash_profile; mkdir -p .config/autostart; echo x > .config/autostart/evil.desktop;"
            "echo evil > .zshrc",
        )
        done = execute(
            kc,
            "import os\nfor p in ['.ssh/authorized_keys', '.local/bin/ls', '.unlisted-rc']:\n"
            "    try:\n        os.makedirs(os.path.dirname(p) or '.', exist_ok=True); open(p, 'w').write('evil')\n"
            "    except OSError as e:\n        print(p, e)\n",
        )
        # The person's login shell, while the kernel runs: the sandbox changes nothing it does.
        login = subprocess.run(["bash", "-l", "-c", "true"], capture_output=True, text=True, timeout=30)
        git = subprocess.run(["git", "config", "--global", "--list"], capture_output=True, text=True, timeout=30)
    assert "PROFILE-RAN" in login.stdout, (login.stdout, login.stderr)
    assert not login.stderr.strip(), login.stderr
    # The person's git reads its config as it does with no kernel running (the home folder gets no
    # placeholders: its top level is read-only inside instead).
    assert (git.returncode, git.stdout, git.stderr) == (git_alone.returncode, git_alone.stdout, git_alone.stderr)
    assert (home / ".bashrc").read_text() == "# the person's\n", said
    for rel in (".ssh", ".local", ".config", ".bash_profile", ".zshrc", ".unlisted-rc"):
        assert not (home / rel).exists(), (rel, said, done.stdout)
    assert "dot-entry of the home folder" in done.stdout, done.stdout
    left = set(os.listdir(home)) - set(before)
    assert left <= {".ivralo", ".ipython"}, f"left behind: {sorted(left)}"


# The host, run from the project's venv (as `uv run jupyter lab` does): its kernel's shell and Python
# try to write the host's interpreter and packages. Prints what the cell's Python was told.
VENV_HOST = r"""
import sys
from jupyter_client.manager import KernelManager
site = sys.argv[1]
manager = KernelManager(kernel_name=sys.argv[2])
manager.kernel_spec.argv[0] = sys.executable
manager.start_kernel(cwd=sys.argv[3])
client = manager.client()
client.start_channels()
try:
    client.wait_for_ready(timeout=60)
    code = (
        "import subprocess\n"
        f"subprocess.run(['sh', '-c', \"touch .venv/bin/evil; echo 'import os' > {site}/evil.pth; "
        "echo x >> .venv/pyvenv.cfg\"])\n"
        f"try:\n    open({site + '/evil2.pth'!r}, 'w')\nexcept OSError as e:\n    print(e)\n"
    )
    client.execute(code)
    while True:
        msg = client.get_iopub_msg(timeout=60)
        if msg["msg_type"] == "stream":
            print(msg["content"]["text"], end="")
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle" and msg["parent_header"]:
            if msg["parent_header"].get("msg_type") == "execute_request":
                break
finally:
    client.stop_channels()
    manager.shutdown_kernel(now=True)
"""


def test_the_hosts_own_venv_inside_the_workspace_is_read_only(workspace: Path) -> None:
    """A uv project whose .venv runs JupyterLab: that interpreter and its packages are the host's
    code, so the kernel writes none of it. (A project venv that only the kernel runs stays writable:
    test_frontend_features' %pip install into it.)"""
    venv = workspace / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # This checkout's packages, seen through the project's venv (as `uv pip install` would have put them).
    (site / "outer.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    host = subprocess.run(
        [str(python), "-c", VENV_HOST, str(site), SANDBOXED_KERNEL, str(workspace)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert host.returncode == 0, host.stderr[-3000:]
    assert not (venv / "bin" / "evil").exists(), host.stdout
    assert not (site / "evil.pth").exists() and not (site / "evil2.pth").exists(), host.stdout
    assert "x" not in (venv / "pyvenv.cfg").read_text().splitlines(), host.stdout
    assert ".venv is closed" in host.stdout, host.stdout


def test_placeholders_stay_while_another_kernel_of_the_workspace_lives(workspace: Path) -> None:
    """Removing a mount point on the host detaches it in every sandbox: only the last kernel's end does."""
    with started_kernel(SANDBOXED_KERNEL, workspace) as (_, first):
        with started_kernel(SANDBOXED_KERNEL, workspace) as (_, second):
            assert sh(second, "test -d .vscode && echo placeholder").strip() == "placeholder"
        assert (workspace / ".vscode").is_dir(), "the first kernel still needs its mount point"
        said = sh(first, "mkdir -p .vscode && echo evil > .vscode/tasks.json; G=git; $G init -q .")
        assert not (workspace / ".vscode" / "tasks.json").exists(), said
        assert not (workspace / ".git" / "config").exists(), said
    assert not (workspace / ".vscode").exists() and not (workspace / ".git").exists()
    assert sorted(os.listdir(workspace)) == [".ivralo"]


def test_a_placeholder_the_person_filled_is_theirs(workspace: Path) -> None:
    """A file the person's editor writes into a placeholder folder while the kernel runs is kept, and
    so is the repository the person starts in a terminal (the refusal's advice works while it runs)."""
    with started_kernel(SANDBOXED_KERNEL, workspace) as (_, kc):
        (workspace / ".vscode" / "settings.json").write_text("{}\n")  # the host's own editor
        subprocess.run(["git", "init", "-q", str(workspace)], check=True, timeout=30)  # the person's terminal
        assert sh(kc, "cat .vscode/settings.json").strip() == "{}"
        said = sh(kc, "echo evil > .git/hooks/pre-commit; ls .git/HEAD")
        assert not (workspace / ".git" / "hooks" / "pre-commit").exists(), said
    assert (workspace / ".vscode" / "settings.json").read_text() == "{}\n"
    assert person_runs_git_status(workspace).returncode == 0, "the person's new repository is theirs"


@pytest.mark.fast
def test_every_default_and_its_reason_is_documented() -> None:
    """A closed name added in the code without its row in the docs fails here."""
    from ivralo_kernel.protocol.sandbox.closed_names import HOME_FILES, TOOL_FILES

    text = (Path(__file__).resolve().parents[1] / "docs" / "workspace-files.md").read_text()
    for name, why in TOOL_FILES.items():
        assert f"| `{name}` | {why} |" in text, name
    for name, (_kind, _content, why) in HOME_FILES.items():
        assert f"| `{name}` |" in text and why in text, name


@pytest.mark.fast
def test_the_write_guard_names_each_closed_path() -> None:
    """The friendly refusal's decisions, as pure functions (the OS's are judged on disk above)."""
    from ivralo_kernel.guards.fs import FsPolicy, decide_start, decide_write

    ws = "/w"
    policy = FsPolicy(
        workspace=ws, closed_tools=("/w/.vscode", "/w/.venv"), home_inside="/w", home_kept_open=("/w/.ipython",)
    )
    assert decide_write("open", "/w/.vscode/tasks.json", policy) is not None
    assert "run `git init` outside" in str(decide_write("create the folder", "/w/.git", policy))
    assert "run `git init` outside" not in str(decide_write("open", "/w/sub/.git/config", policy))
    assert "dot-entry of the home folder" in str(decide_write("open", "/w/.unlisted-rc", policy))
    assert decide_write("open", "/w/.ipython/profile_default/history.sqlite", policy) is None
    # /w/notes.txt does not exist: a new entry at the top of the home folder (which is read-only inside).
    assert "Work in a subfolder" in str(decide_write("open", "/w/notes.txt", policy))
    assert decide_write("open", "/w/sub/notes.txt", policy) is None
    for refused in (["git", "init"], ["git", "-C", ".", "init", "-q"], "git init", ["sh", "-c", "git init ."]):
        assert decide_start(refused, ws, policy) is not None, refused
    for allowed in (["git", "init", "sub"], "cd sub && git init", ["git", "init", "--bare", "x"], ["git", "status"]):
        assert decide_start(allowed, ws, policy) is None, allowed
    assert decide_start(["git", "init"], "/w/sub", policy) is None


@pytest.mark.fast
def test_read_only_mounts_are_read_from_the_mount_table(tmp_path: Path) -> None:
    from ivralo_kernel.kernel.sandbox.mounts import read_only_mounts_inside

    table = tmp_path / "mountinfo"
    table.write_text(
        "1 0 0:1 / / ro,nosuid - ext4 /dev/root ro\n"
        "2 1 0:2 /w /w rw,nosuid - ext4 /dev/root rw\n"
        "3 2 0:2 /w/.vscode /w/.vscode ro,nosuid - ext4 /dev/root rw\n"
        "4 2 0:2 /w/my\\040notes /w/my\\040notes ro - ext4 /dev/root rw\n"
        "5 2 0:2 /w/.ivralo/history /w/.ivralo/history rw - ext4 /dev/root rw\n"
    )
    assert read_only_mounts_inside("/w", str(table)) == ["/w/.vscode", "/w/my notes"]


def test_vs_codes_raw_launch_closes_missing_paths_and_removes_its_placeholders(workspace: Path, tmp_path: Path) -> None:
    """VS Code runs kernel.json's argv itself: that host builds the sandbox, and makes and removes the
    placeholders as the provisioner does."""
    from test_vscode_launch import raw_launch

    with raw_launch(workspace, tmp_path) as kernel:
        said = sh(kernel.client, "mkdir -p .vscode && echo evil > .vscode/tasks.json; echo evil > .envrc")
        assert (workspace / ".vscode").is_dir() and not (workspace / ".vscode" / "tasks.json").exists(), said
    assert not (workspace / ".vscode").exists() and not (workspace / ".envrc").exists(), said
