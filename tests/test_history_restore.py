"""Undo: what a cell overwrote, truncated, renamed over or deleted is listed and restored byte for byte,
from the person's shell (``ivralo-kernel history``) and from the agent API (``Session.history/restore``),
never from the kernel. A restore refuses to overwrite a newer change without --force, and keeps what it
overwrites; a kernel that goes on writing after a host-side restore still prunes to its caps."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from ivralo_kernel.cli.app import main
from ivralo_kernel.guards.history import History
from ivralo_kernel.host import Session, SyncSession, WorkerConfig
from ivralo_kernel.host.history.ledger import MAX_INDEX_BYTES, HistoryRecorder, closed_reason
from ivralo_kernel.host.history.store import HistoryError, HistoryStore, NewerChangeError
from ivralo_kernel.protocol.history_index import INDEX, copy_id, parse_line

# Binary, and different for each file: a restore that mixed them up, or decoded them, shows.
PAYLOADS = {name: bytes(range(256)) * 20 + name.encode() for name in ("a.bin", "b.bin", "c.bin", "d.bin")}
CHANGES = """
import os
open('a.bin', 'wb').write(b'overwritten')
os.truncate('b.bin', 0)
open('c.new', 'wb').write(b'renamed over'); os.replace('c.new', 'c.bin')
os.remove('d.bin')
"""
OPERATIONS = {"a.bin": "open for writing", "b.bin": "truncate", "c.bin": "move onto", "d.bin": "delete"}


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["history", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def latest_ids(ws: Path) -> dict[str, str]:
    """Each file's newest copy's ID, from `history list --json` (newest first)."""
    ids: dict[str, str] = {}
    for entry in HistoryStore(ws).entries():
        ids.setdefault(os.path.basename(entry.path), entry.id)
    return ids


def put_payloads(ws: Path) -> None:
    for name, payload in PAYLOADS.items():
        (ws / name).write_bytes(payload)
        (ws / name).chmod(0o640)


def assert_restored(ws: Path) -> None:
    for name, payload in PAYLOADS.items():
        assert (ws / name).read_bytes() == payload, f"{name} after {OPERATIONS[name]}"
        assert (ws / name).stat().st_mode & 0o777 == 0o640, name


def test_restore_after_overwrite_truncate_rename_over_and_delete(
    workspace: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    put_payloads(workspace)
    monkeypatch.chdir(workspace)
    with SyncSession(workspace=workspace) as session:
        assert isinstance(session.run(CHANGES), str)
        assert not (workspace / "d.bin").exists() and (workspace / "c.bin").read_bytes() == b"renamed over"

        # The person's shell: list, show, restore each, while the kernel still runs.
        code, out, _ = cli(capsys, "list")
        assert code == 0
        for name, operation in OPERATIONS.items():
            assert any(name in line and operation in line for line in out.splitlines()), (name, out)
        listed = json.loads(cli(capsys, "list", "--json")[1])
        assert [e["path"] for e in listed] == ["d.bin", "c.bin", "b.bin", "a.bin"], "newest first"
        assert {e["path"]: e["size"] for e in listed} == {n: len(p) for n, p in PAYLOADS.items()}
        code, out, _ = cli(capsys, "show", latest_ids(workspace)["a.bin"])
        assert code == 0 and f"binary content, {len(PAYLOADS['a.bin'])} bytes" in out and "a.bin differs" in out, out
        for name, copy_id in latest_ids(workspace).items():
            code, out, err = cli(capsys, "restore", copy_id)
            assert code == 0, err
            assert out.startswith(f"Restored {name} "), out
        assert_restored(workspace)
        kept = [e for e in HistoryStore(workspace).entries() if e.operation == "restore"]
        assert sorted(os.path.basename(e.path) for e in kept) == ["a.bin", "b.bin", "c.bin"]  # d.bin was gone

        # The kernel changes them again; the agent API restores them.
        assert isinstance(session.run(CHANGES), str)
        copies = session.history()
        assert {c["path"] for c in copies[:4]} == set(PAYLOADS), "newest first"
        for name, copy_id in latest_ids(workspace).items():
            done = session.restore(copy_id)
            assert done["path"] == name and done["restored"] == copy_id and not done["unchanged"], done
        assert_restored(workspace)
        assert session.restore(latest_ids(workspace)["d.bin"])["unchanged"] is True  # twice: nothing to do

        # Restoring is the host's act: the kernel still cannot read the history.
        refused = session.run(f"open({os.path.join('.ivralo', 'history', INDEX)!r}).read()")
        assert isinstance(refused, dict) and "read guard" in refused["error"], refused


def test_a_restore_refuses_to_overwrite_a_newer_change(
    workspace: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    notes = workspace / "notes.txt"
    notes.write_text("the person's original\n")
    monkeypatch.chdir(workspace)
    with SyncSession(workspace=workspace) as session:
        assert isinstance(session.run("open('notes.txt', 'w').write('the kernel wrote this\\n')"), str)
        (copy,) = session.history("notes.txt")
        # The person edits the file a minute after the kernel's change (its mtime says when).
        notes.write_text("the person's later edit\n")
        edited_at = os.stat(notes).st_mtime_ns // 1_000_000_000 + 60
        os.utime(notes, (edited_at, edited_at))

        code, _, err = cli(capsys, "restore", copy["id"])
        assert code == 2 and "was modified at" in err and "add --force" in err, err
        with pytest.raises(NewerChangeError, match="add force=True"):
            session.restore(copy["id"])
        assert notes.read_text() == "the person's later edit\n", "a refusal changes nothing"

        code, out, err = cli(capsys, "restore", copy["id"], "--force")
        assert code == 0 and "The state it replaced is kept as copy" in out, err
        assert notes.read_text() == "the person's original\n"
        kept = session.history("notes.txt")[0]
        assert kept["operation"] == "restore"
        assert (workspace / kept["copy"]).read_text() == "the person's later edit\n"
        # The restore is undone like any other change: its copy is the newest, so no --force.
        assert session.restore(kept["id"])["kept"] is not None
        assert notes.read_text() == "the person's later edit\n"

        # A later copy of the same file is a newer change too: the kernel wrote twice.
        session.run("for text in ('one', 'two'): open('notes.txt', 'w').write(text)")
        newest, older = session.history("notes.txt")[:2]
        code, _, err = cli(capsys, "restore", older["id"])
        assert code == 2 and f"the newest, {newest['id']}" in err, err
        assert cli(capsys, "restore", newest["id"])[0] == 0
        assert notes.read_text() == "one"


def test_a_kernel_writing_after_a_host_restore_still_prunes_to_its_caps(workspace: Path) -> None:
    (workspace / "f.txt").write_text("start")
    config = WorkerConfig(history_cap_count=5)
    with SyncSession(workspace=workspace, config=config) as session:
        assert isinstance(session.run("for n in range(6): open('f.txt', 'w').write(str(n))"), str)
        restored = session.restore(session.history()[-1]["id"], force=True)  # the oldest: adds a copy
        folder = workspace / ".ivralo" / "history"
        on_disk = {p.name for p in folder.iterdir() if not p.name.startswith(INDEX)}
        assert len(on_disk) == 6, "the host's copy is added; the next kernel write prunes"
        assert isinstance(session.run("for n in range(12): open('g.txt', 'w').write(str(n))"), str)
    on_disk = {p.name for p in folder.iterdir() if not p.name.startswith(INDEX)}
    lines = [parse_line(line) for line in (folder / INDEX).read_text().splitlines()]
    indexed = {e.copy for e in lines if e is not None}
    assert len(on_disk) == 5, sorted(on_disk)
    assert on_disk <= indexed, "every copy on disk has its line (the kernel's compaction kept the host's)"
    assert len(lines) <= 2 * 5
    kept = {e.id for e in HistoryStore(workspace).entries()}
    assert restored["kept"] not in kept and len(kept) == 5, "the host's copy counted, and pruned in its turn"


FORGE_BY_SH = """
import json, shlex, subprocess, time
for copy, target, content in {forgeries!r}:
    line = json.dumps({{"time": "2026-11-29T10:00:00+0000", "ns": time.time_ns(), "path": target,
                        "operation": "open for writing", "size": len(content), "copy": copy}})
    script = f"printf %s {{shlex.quote(content)}} > .ivralo/history/{{copy}} && "
    script += f"printf '%s\\n' {{shlex.quote(line)}} >> .ivralo/history/index.jsonl"
    print(subprocess.run(["sh", "-c", script]).returncode, end=" ")
"""


def test_copies_code_in_the_kernel_forges_or_rewrites_are_never_restored(
    workspace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cell forges copies and index lines with sh (the history folder is writable inside) for
    .vscode/settings.json and databases.json, and rewrites a genuine copy: neither Session.restore
    nor the person's `history restore` writes any of it. Judged by the files on disk."""
    ws = Path(os.path.realpath(workspace))
    (ws / "notes.txt").write_text("the person's notes\n")
    (ws / "databases.json").write_text('{"shop": "SHOP_DB_URL"}')
    forgeries = [
        ("20261129-100000-000000001-settings.json", str(ws / ".vscode" / "settings.json"), '{"evil": true}'),
        ("20261129-100000-000000002-databases.json", str(ws / "databases.json"), '{"evil": "EVIL_URL"}'),
    ]
    with SyncSession(workspace=workspace) as session:
        assert session.run(FORGE_BY_SH.format(forgeries=forgeries)) == "0 0 "
        assert session.history() == []
        for copy, _target, _content in forgeries:
            with pytest.raises(HistoryError, match="the host never recorded that copy"):
                session.restore(copy_id(copy))
            code, _, err = cli(capsys, "restore", copy_id(copy), "--force", "--workspace", str(ws))
            assert code != 0 and "never recorded" in err, err

        # A genuine copy (the write guard's, recorded by the host), then rewritten from sh.
        assert session.run("_ = open('notes.txt', 'w').write('a cell wrote this\\n')") == ""
        (genuine,) = session.history()
        rewrite = f"printf evil > .ivralo/history/{genuine['copy'].split('/')[-1]}"
        out = session.run(f"import subprocess\nsubprocess.run(['sh', '-c', {rewrite!r}])")
        assert isinstance(out, str), out
        with pytest.raises(HistoryError, match="no longer holds the bytes the host recorded"):
            session.restore(genuine["id"], force=True)
    assert not (ws / ".vscode").exists()
    assert (ws / "databases.json").read_text() == '{"shop": "SHOP_DB_URL"}'
    assert (ws / "notes.txt").read_text() == "a cell wrote this\n"


# Without a kernel: the rules, on copies the write guard's own History makes --------------------------
def kept_by_guard(ws: Path, name: str, operation: str = "open for writing") -> None:
    """A copy the write guard's own History makes, recorded by the host as a kernel's host records it
    (a recorder made before the kernel starts, a pass when its execution ends)."""
    recorder = HistoryRecorder(str(ws))
    History(str(ws / ".ivralo" / "history")).save(str(ws / name), operation)
    assert recorder.record() == 1, recorder.refused


@pytest.mark.fast
def test_ids_paths_and_times_pick_the_right_copy(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ws = Path(os.path.realpath(workspace))
    (ws / "sub").mkdir()
    for text in ("v1", "v2", "v3"):
        (ws / "sub" / "n.txt").write_text(text)
        kept_by_guard(ws, "sub/n.txt")
    (ws / "sub" / "n.txt").write_text("v4")
    store = HistoryStore(ws)
    entries = store.entries()
    assert [store.read(e)[0] for e in entries] == [b"v3", b"v2", b"v1"], "newest first"
    assert store.find(entries[1].id[:4]) == entries[1] == store.find(entries[1].copy)
    with pytest.raises(HistoryError, match="no kept copy has the ID ffffffff"):
        store.find("ffffffff")
    assert store.listing("sub", base=str(ws)) == entries == store.listing("n.txt", base=str(ws / "sub"))
    assert store.listing("other.txt", base=str(ws)) == []
    # --at: the file as it was then, i.e. the first copy taken after that time.
    assert store.at("sub/n.txt", entries[1].ns - 1, base=str(ws)) == entries[1]
    assert store.at("sub/n.txt", 0, base=str(ws)) == entries[2]
    with pytest.raises(HistoryError, match="no cell changed it since"):
        store.at("sub/n.txt", entries[0].ns, base=str(ws))
    code, out, _ = cli(capsys, "show", entries[2].id, "--workspace", str(ws))
    assert code == 0 and out.rstrip().endswith("v1") and "sub/n.txt differs" in out, out
    code, _, err = cli(capsys, "restore", "sub/n.txt", "--at", "not a time", "--workspace", str(ws))
    assert code == 2 and "is not a time" in err, err


@pytest.mark.fast
def test_the_newer_change_rules(workspace: Path) -> None:
    ws = Path(os.path.realpath(workspace))
    store = HistoryStore(ws)
    gone = ws / "gone.txt"
    gone.write_text("kept")
    kept_by_guard(ws, "gone.txt", "delete")
    gone.unlink()
    (entry,) = store.entries()
    assert store.newer_change(entry) is None, "deleted and still gone: nothing newer"
    gone.write_text("made again")
    assert "created again since" in str(store.newer_change(entry))
    with pytest.raises(NewerChangeError):
        store.restore(entry)
    assert store.restore(entry, force=True).kept is not None
    assert gone.read_text() == "kept"
    # A file that is now missing is no newer change: nothing would be overwritten.
    (ws / "x.txt").write_text("x")
    kept_by_guard(ws, "x.txt", "truncate")
    os.truncate(ws / "x.txt", 0)
    (x,) = store.listing("x.txt", base=str(ws))
    assert store.newer_change(x) is None, "the truncate itself, moments after its copy, is not newer"
    (ws / "x.txt").unlink()
    assert store.newer_change(x) is None and store.restore(x).kept is None


def plant(folder: Path, lines: list[tuple[str, str]], content: str = "forged") -> None:
    """Copies and index lines as code in the kernel could write them (the folder is writable inside)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / INDEX, "a") as index:
        for path, copy in lines:
            if "/" not in copy and not (folder / copy).exists():
                (folder / copy).write_text(content)
            line = {"time": "2026-11-29T10:00:00+0000", "ns": time.time_ns(), "path": path, "operation": "delete"}
            index.write(json.dumps({**line, "size": len(content), "copy": copy}) + "\n")


@pytest.mark.fast
def test_a_forged_index_line_restores_nothing_outside_or_through_a_link(tmp_path: Path, workspace: Path) -> None:
    """The history folder is writable from the kernel's side: the host records only the lines it
    gained while a kernel ran, each checked (inside the workspace, no closed path, a plain copy)."""
    ws = Path(os.path.realpath(workspace))
    folder = ws / ".ivralo" / "history"
    folder.mkdir(parents=True)
    secret = tmp_path / "secret"
    secret.write_text("not the workspace's")
    # Planted before any kernel ran (a cloned repository's .ivralo/history): never recorded.
    plant(folder, [(str(ws / "in.txt"), "planted-before")])
    recorder = HistoryRecorder(str(ws))
    (folder / "linked").symlink_to(secret)
    os.link(secret, folder / "hard")
    plant(
        folder,
        [
            (str(tmp_path / "outside.txt"), "plain1"),
            (str(ws / ".git" / "hooks" / "pre-commit"), "plain2"),
            (str(ws / "sub" / ".GIT" / "config"), "plain3"),
            (str(ws / ".vscode" / "settings.json"), "plain4"),
            (str(ws / "databases.json"), "plain5"),
            (str(ws / ".idea" / "workspace.xml"), "plain6"),
            (str(ws / ".env.local"), "plain7"),
            (str(ws / "sub" / ".." / "in.txt"), "plain8"),
            (str(ws / "in.txt"), "linked"),
            (str(ws / "in.txt"), "hard"),
            (str(ws / "in.txt"), "../secret"),
        ],
    )
    assert recorder.record() == 0
    refused = "\n".join(recorder.refused)
    for why in (
        "plain1: " + str(tmp_path / "outside.txt") + " is not a file inside the workspace",
        "plain2: .git/hooks/pre-commit is under .git",
        "plain3: sub/.GIT/config is under .git",
        "plain4: .vscode/settings.json is under .vscode",
        "plain5: databases.json is under databases.json",
        "plain6: .idea/workspace.xml is under .idea",
        "plain7: .env.local is a .env file",
        "plain8: " + str(ws / "sub" / ".." / "in.txt") + " is not a file inside the workspace",
        "linked: its copy is not a plain file",
        "hard: its copy is not a plain file",
    ):
        assert why in refused, (why, refused)
    store = HistoryStore(ws)
    assert store.entries() == [] and store.unrecorded() == 11
    with pytest.raises(HistoryError, match="the host never recorded that copy"):
        store.find("planted-before")
    for line in (folder / INDEX).read_text().splitlines():  # and restored straight from a line: refused too
        entry = parse_line(line)
        if entry is None:  # ../secret: not a file name of the folder, so not an entry at all
            continue
        with pytest.raises(HistoryError, match=r"not inside the workspace|where code may not write|host's record"):
            store.restore(entry, force=True)
    assert not (tmp_path / "outside.txt").exists() and not (ws / ".git").exists() and not (ws / "in.txt").exists()
    assert not (ws / ".vscode").exists() and not (ws / "databases.json").exists() and not (ws / "sub").exists()


@pytest.mark.fast
def test_a_recorded_copy_rewritten_since_or_a_link_on_its_path_restores_nothing(
    tmp_path: Path, workspace: Path
) -> None:
    ws = Path(os.path.realpath(workspace))
    (ws / "sub").mkdir()
    (ws / "sub" / "n.txt").write_text("the person's")
    kept_by_guard(ws, "sub/n.txt")
    store = HistoryStore(ws)
    (entry,) = store.entries()
    # A later kernel rewrites the copy (sh can, inside the sandbox): the bytes no longer match.
    (ws / ".ivralo" / "history" / entry.copy).write_text("a later kernel's")
    with pytest.raises(HistoryError, match="no longer holds the bytes the host recorded"):
        store.restore(entry, force=True)
    (ws / ".ivralo" / "history" / entry.copy).write_text("the person's")
    # A folder on its path replaced by a link out of the workspace: nothing is written through it.
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (ws / "sub" / "n.txt").unlink()
    (ws / "sub").rmdir()
    (ws / "sub").symlink_to(outside)
    with pytest.raises(HistoryError, match="no longer a folder"):
        store.restore(entry, force=True)
    assert list(outside.iterdir()) == []
    # The file itself swapped for a link out of the workspace: the link is replaced, its target untouched.
    (ws / "top.txt").write_text("the person's top")
    kept_by_guard(ws, "top.txt")
    (top,) = store.listing("top.txt", base=str(ws))
    (outside / "target.txt").write_text("outside, untouched")
    (ws / "top.txt").unlink()
    (ws / "top.txt").symlink_to(outside / "target.txt")
    assert store.restore(top, force=True).path == "top.txt"
    assert not (ws / "top.txt").is_symlink() and (ws / "top.txt").read_text() == "the person's top"
    assert (outside / "target.txt").read_text() == "outside, untouched"
    # The tool_files setting closes more: a restore under it is refused as well.
    with pytest.raises(HistoryError, match=r"sub/n\.txt is under sub"):
        HistoryStore(ws, tool_files=("sub",)).restore(entry, force=True)


@pytest.mark.fast
def test_an_index_blown_up_from_the_kernels_side_is_not_read(workspace: Path) -> None:
    """The host's memory is not the kernel's to spend: an index past MAX_INDEX_BYTES is not read."""
    ws = Path(os.path.realpath(workspace))
    folder = ws / ".ivralo" / "history"
    recorder = HistoryRecorder(str(ws))
    plant(folder, [(str(ws / "in.txt"), "plain1")])
    os.truncate(folder / INDEX, MAX_INDEX_BYTES + 1)  # sparse: its size is what counts
    assert recorder.record() == 0
    assert any("not read" in why for why in recorder.refused), recorder.refused
    assert HistoryStore(ws).entries() == []


@pytest.mark.fast
def test_a_readonly_session_restores_nothing(workspace: Path) -> None:
    async def check() -> None:
        async with Session(workspace=workspace, role="readonly") as session:
            assert await session.history() == []
            with pytest.raises(HistoryError, match="role is readonly"):
                await session.restore("abcd1234")

    asyncio.run(check())


@pytest.mark.fast
def test_with_the_workspace_holding_the_home_folder_no_restore_writes_its_dot_entries() -> None:
    """The sandbox keeps every dot-entry of the home folder closed, existing or not (JupyterLab
    started in ``$HOME``): a restore is refused there as well, and the home folder's other files are not."""
    assert "home folder's .ssh" in (closed_reason(".ssh/authorized_keys", home="") or "")
    assert "home folder's .bashrc" in (closed_reason("alice/.bashrc", home="alice") or "")
    assert closed_reason("alice/notes.txt", home="alice") is None
    assert closed_reason("bob/.bashrc", home="alice") is None  # not the home folder: a project's file
    assert closed_reason(".bashrc") is None  # no home folder in the workspace


@pytest.mark.fast
def test_no_file_is_restored_over_a_folder_now_on_its_path(workspace: Path) -> None:
    ws = Path(os.path.realpath(workspace))
    store = HistoryStore(ws)
    (ws / "was_file").write_text("kept")
    kept_by_guard(ws, "was_file", "delete")
    (ws / "was_file").unlink()
    (ws / "was_file").mkdir()
    (ws / "was_file" / "inside.txt").write_text("untouched")
    (entry,) = store.entries()
    with pytest.raises(HistoryError, match=r"^was_file is a folder now, so no file is restored over it\. Nothing"):
        store.restore(entry, force=True)
    assert (ws / "was_file").is_dir() and (ws / "was_file" / "inside.txt").read_text() == "untouched"
