"""Secrets stay out of the kernel's reach, judged from outside: its memory (``/proc/<pid>/mem``, read
as root, as CI runs), its environment and a child's. The workspace ``.env`` is read by the host, and
only its plain values reach the kernel; the scrub catches the names the seed rule missed and the
session's agent and IPC variables."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import FALLBACK_KERNEL, SANDBOXED_KERNEL, kernel_in_tree
from kernel_helpers import execute
from sandbox_cases import started_kernel

# Made-up values, each a marker: none may be found in the kernel's memory or environments.
MARKERS = {
    "WS_API_KEY": "sk-ws-4f1e9a2c7b",  # in .env
    "GITHUB_PAT": "ghp-7c2d9e1f3a",  # in .env: a name the seed rule missed
    "SMTP_PASS": "smtp-8b3a6d2e",  # in .env
    "DATABASE_URL": "postgres://app:pw-5e8c1d7a@db.invalid/shop",  # in .env: a URL with a password
    "HOST_ONLY_TOKEN": "tok-2a9f4c6b",  # in the host's environment
    "SSH_AUTH_SOCK": "/tmp/ssh-marker-3d7e/agent.1",  # the session's agent
    "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/0/bus-marker-6c1f",
    "TMUX": "/tmp/tmux-marker-9e2b/default,1,0",
}
IN_DOTENV = ("WS_API_KEY", "GITHUB_PAT", "SMTP_PASS", "DATABASE_URL")
PROBE = """
import json, os, subprocess
child = subprocess.run(['env'], capture_output=True, text=True).stdout
print(json.dumps({'env': sorted(os.environ), 'child': [l.split('=', 1)[0] for l in child.splitlines()],
                  'plain': os.environ.get('FROM_DOTENV')}))
"""


def memory_holds(pid: int, needles: list[bytes]) -> list[bytes]:
    """The needles found in the writable memory of ``pid`` (heap, stacks, anonymous maps)."""
    found: set[bytes] = set()
    with open(f"/proc/{pid}/maps", encoding="ascii") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("rw"):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                data = os.pread(mem.fileno(), end - start, start)
            except OSError:
                continue  # a guard page, or a mapping gone meanwhile
            found |= {needle for needle in needles if needle in data}
    return sorted(found)


@pytest.mark.parametrize("kernel_name", [SANDBOXED_KERNEL, FALLBACK_KERNEL])
def test_no_secret_reaches_the_kernel(workspace: Path, kernel_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("reading another process's memory needs root (CI runs as root)")
    dotenv = [f"{name}={MARKERS[name]}" for name in IN_DOTENV] + ["FROM_DOTENV=plain-value"]
    (workspace / ".env").write_text("\n".join(dotenv) + "\n")
    for name in MARKERS:
        if name not in IN_DOTENV:
            monkeypatch.setenv(name, MARKERS[name])
    with started_kernel(kernel_name, workspace) as (km, kc):
        seen = json.loads(execute(kc, PROBE).stdout)
        assert seen["plain"] == "plain-value"  # the .env's plain values do arrive
        for where in ("env", "child"):
            assert not set(MARKERS) & set(seen[where]), where
        assert km.provisioner is not None
        kernel = kernel_in_tree(km.provisioner.process.pid)
        assert memory_holds(kernel, [value.encode() for value in MARKERS.values()]) == []


STORES = {
    ".ssh/id_ed25519": "ssh-key-marker-1b7d",
    ".aws/credentials": "aws-marker-6f2a",
    ".netrc": "netrc-marker-9c4e",
}
READ_STORES = """
import json, os, subprocess
out = {}
for rel in %r:
    path = os.path.join(os.path.expanduser('~'), rel)
    try:
        out[rel] = open(path).read()
    except OSError as e:
        out[rel] = f'{type(e).__name__}: {e}'
    out['sh ' + rel] = subprocess.run(['sh', '-c', f'cat {path}'], capture_output=True, text=True).stdout
print(json.dumps(out))
"""


@pytest.mark.parametrize("kernel_name", [SANDBOXED_KERNEL, FALLBACK_KERNEL])
def test_credential_stores_are_out_of_reach(
    workspace: Path, tmp_path: Path, kernel_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Empty in the sandbox for every process; without it, the read guard refuses Python with its
    sentence, and Landlock's read floor every other process."""
    home = tmp_path / "home"
    for rel, marker in STORES.items():
        (home / rel).parent.mkdir(parents=True, exist_ok=True)
        (home / rel).write_text(marker)
    monkeypatch.setenv("HOME", str(home))
    with started_kernel(kernel_name, workspace) as (_, kc):
        seen = json.loads(execute(kc, READ_STORES % (list(STORES),)).stdout)
    for rel, marker in STORES.items():
        assert marker not in seen[rel], rel
        if kernel_name == SANDBOXED_KERNEL:
            assert marker not in seen["sh " + rel], rel
        else:
            assert "is a credential store of the person's" in seen[rel], seen[rel]
            assert marker not in seen["sh " + rel], rel  # the fallback's read floor


WRITE_CONFIG = """
import json, os, subprocess
home = os.path.expanduser('~')
out = {}
for rel in ('.config/ivralo/apis.json', '.config/ivralo/trusted-folders.json', '.bashrc'):
    path = os.path.join(home, rel)
    try:
        with open(path, 'w') as f:
            f.write('{"written": "by the kernel"}')
        out[rel] = 'written'
    except OSError as e:
        out[rel] = f'{type(e).__name__}: {e}'
    sh = subprocess.run(['sh', '-c', f'echo x >> {path}'], capture_output=True, text=True)
    out['sh ' + rel] = sh.returncode
    try:
        out['read ' + rel] = open(path).read()
    except OSError as e:
        out['read ' + rel] = type(e).__name__
open('notes.txt', 'w').write('ordinary work')
print(json.dumps(out))
"""


@pytest.mark.parametrize("kernel_name", [SANDBOXED_KERNEL, FALLBACK_KERNEL])
def test_started_in_the_home_folder_the_persons_config_stays_closed(
    tmp_path: Path, kernel_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JupyterLab started in the home folder: the workspace is $HOME. Its configuration (the config
    home's apis.json and trust store, dot-files) is not the kernel's to write; judged on disk.
    Ordinary files of the workspace stay writable. Without the sandbox, Python is refused (a shell
    is that mode's gap, which its banner names)."""
    home = tmp_path / "home"
    config = home / ".config" / "ivralo"
    config.mkdir(parents=True)
    originals = {
        config / "apis.json": '{"operations": {}}',
        config / "trusted-folders.json": "[]",
        home / ".bashrc": "# the person's\n",
    }
    for path, text in originals.items():
        path.write_text(text)
    # A file already at the top: the home folder's top level takes no new entry (tests/test_closed_links_and_home.py).
    (home / "notes.txt").write_text("")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("IVRALO_CONFIG_HOME", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    with started_kernel(kernel_name, home) as (_, kc):
        seen = json.loads(execute(kc, WRITE_CONFIG).stdout)
    for rel in (".config/ivralo/apis.json", ".config/ivralo/trusted-folders.json", ".bashrc"):
        assert seen[rel] != "written", (rel, seen)
        assert "the person's own configuration" in seen[rel], seen[rel]  # the friendly refusal, both modes
    if kernel_name == SANDBOXED_KERNEL:  # the shell too: read-only, or a private empty folder
        for path, text in originals.items():
            assert path.read_text() == text, path
    else:  # Python refused; the shell line got through (the fallback's gap)
        assert (config / "apis.json").read_text().startswith(originals[config / "apis.json"])
    assert (home / "notes.txt").read_text() == "ordinary work"
