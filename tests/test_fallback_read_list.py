"""The fallback's read allow list (protocol/sandbox/fallback_reads.py): what it grants around the closed
paths, and what Landlock then refuses, in a child process (Landlock cannot be undone), judged by
what the child's ``cat`` could copy into a file the test reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ivralo_kernel.guards.landlock import abi
from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.sandbox.fallback_reads import (
    closed_reads,
    interpreter_trees,
    jupyter_runtime_dir,
    read_allow_list,
    split_around,
)

SECRET = "fake-key-91d0c3"


def _home(tmp_path: Path) -> tuple[Path, list[str]]:
    """A home folder as docker-stacks has it: the runtime folder and a key in it, data beside them,
    and a link into ~/.ssh that must not open it."""
    home = tmp_path / "home"
    runtime = home / ".local" / "share" / "jupyter" / "runtime"
    runtime.mkdir(parents=True)
    (runtime / "kernel-other.json").write_text(f'{{"key": "{SECRET}"}}')
    (home / ".local" / "share" / "jupyter" / "kernels").mkdir()
    (home / ".local" / "lib").mkdir()
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_rsa").write_text(SECRET)
    (home / "data").mkdir()
    (home / "data" / "table.csv").write_text("a,b\n1,2\n")
    (home / "notes.txt").write_text("hello")
    (home / "innocent").symlink_to(home / ".ssh")
    env = {"HOME": str(home)}
    closed = closed_reads(env, [str(home / ".ssh")], [jupyter_runtime_dir(env)])
    return home, closed


def test_a_folder_holding_a_closed_path_is_granted_entry_by_entry(tmp_path: Path) -> None:
    home, closed = _home(tmp_path)
    rules, was_split = split_around(str(home), closed)
    assert was_split
    granted = {os.path.relpath(r, home) for r in rules}
    assert {"data", "notes.txt", ".local/lib", ".local/share/jupyter/kernels"} <= granted
    assert not any(g.startswith((".ssh", "innocent", ".local/share/jupyter/runtime")) for g in granted), granted
    assert str(home) not in rules and str(home / ".local") not in rules
    assert split_around(str(home / "data"), closed) == ([str(home / "data")], False)
    assert split_around(str(home / ".ssh"), closed) == ([], True)


@pytest.mark.timeout(120)
@pytest.mark.skipif(abi() < 1, reason="Landlock is not available on this kernel: the read floor cannot exist")
def test_the_home_folder_as_workspace_keeps_its_closed_paths_closed(tmp_path: Path) -> None:
    home, closed = _home(tmp_path)
    rules, split = read_allow_list(workspace=str(home), home=str(home), own=(), extra=(), closed=closed)
    assert str(home) in split
    out = tmp_path / "out"
    out.mkdir()
    child = f"""
import json, subprocess, sys
from ivralo_kernel.guards import landlock
result = landlock.apply(landlock.LandlockRules(read_trees=tuple(json.loads(sys.argv[1])), write_trees=({str(out)!r},)))
assert 'fs-read' in result.handled, result
home, out = {str(home)!r}, {str(out)!r}
script = (
    f'cat {{home}}/.ssh/id_rsa > {{out}}/key; cat {{home}}/innocent/id_rsa > {{out}}/link; '
    f'cat {{home}}/.local/share/jupyter/runtime/kernel-other.json > {{out}}/other; '
    f'ls {{home}}/.local/share/jupyter/runtime > {{out}}/listing; '
    f'cat {{home}}/data/table.csv > {{out}}/data; cat {{home}}/notes.txt > {{out}}/notes; '
    f'cat /etc/hosts > {{out}}/hosts; cat /proc/self/root{{home}}/.ssh/id_rsa > {{out}}/proc; '
    f'ln {{home}}/.ssh/id_rsa {{out}}/hard; cat {{out}}/hard > {{out}}/hardcat'
)
subprocess.run(['sh', '-c', script], timeout=30)
"""
    done = subprocess.run(
        [sys.executable, "-c", child, json.dumps([*rules, str(out)])], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert not (out / "hard").exists(), "a hard link would carry the key into a readable folder"
    for name in ("key", "link", "other", "listing", "proc", "hardcat"):
        text = (out / name).read_text()
        assert SECRET not in text and "kernel-other" not in text, name
    assert (out / "data").read_text() == "a,b\n1,2\n"
    assert (out / "notes").read_text() == "hello"
    assert "localhost" in (out / "hosts").read_text()


def test_without_the_read_floor_the_report_says_what_is_readable() -> None:
    from ivralo_kernel.kernel.sandbox.sandbox_report import fallback_note, sandbox_layers

    for landlock in (
        "off (turned off by the host's settings)",
        "unavailable: Landlock is not available",
        "ABI 7: fs-write",
    ):
        said = sandbox_layers("no user namespaces", landlock)["not_stopped"]
        assert "read floor is not in force" in said and landlock in said, said
        assert "read floor is not in force" in fallback_note("no user namespaces", landlock)
    assert "not in force" not in sandbox_layers("no user namespaces", "ABI 7: fs-write, fs-read")["not_stopped"]


def test_a_project_kernels_private_path_is_readable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A project's interpreter imports ivralo's kernel side from the private path, which is off its
    sys.path (protocol.private_code): its folders are granted all the same (without them such a kernel
    cannot start in the fallback: its first import of zmq is refused)."""
    site = tmp_path / "ivralo-env" / "site-packages"
    monkeypatch.setenv(names.ENV_CODE_PATH, f"{site}{os.pathsep}relative{os.pathsep}")
    trees = interpreter_trees()
    assert str(site) in trees and "relative" not in trees
