"""The workspace files the host trusts (.env, databases.json, .ivralo/permissions.json) are not the
kernel's to write. Without the sandbox a shell line can write them; the host then sets them aside,
at once and at the next start, until the person approves them. Judged by a loopback server's log."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from sandbox_cases import counting_http

from ivralo_kernel.cli import main
from ivralo_kernel.host import Session, WorkerConfig

FALLBACK = WorkerConfig(sandbox="off", landlock_network=False)
GET = "import urllib.request\nprint(urllib.request.urlopen('http://127.0.0.1:{port}/{path}', timeout=5).status)"


def grant_itself(port: int) -> str:
    permissions = json.dumps({"hosts": {"allow": [f"127.0.0.1:{port}"]}})
    script = f"mkdir -p .ivralo && echo {shlex.quote(permissions)} > .ivralo/permissions.json"
    return f"import subprocess\nsubprocess.run(['sh', '-c', {script!r}], check=True)"


async def test_a_kernel_cannot_grant_itself_the_network(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with counting_http() as (port, hits):
        async with Session(workspace=workspace, config=FALLBACK) as session:
            await session.run(grant_itself(port))
            assert (workspace / ".ivralo" / "permissions.json").exists()  # the fallback's gap: the shell wrote
            refused = await session.run(GET.format(port=port, path="same-run"))
            assert isinstance(refused, dict) and "refused" in refused["error"], refused
        async with Session(workspace=workspace, config=FALLBACK) as session:
            refused = await session.run(GET.format(port=port, path="next-start"))
            assert isinstance(refused, dict) and "refused" in refused["error"], refused
            notes = "\n".join(session.kernel_info["ivralo"]["notes"])  # the banner's lines
            assert ".ivralo/permissions.json was changed while a kernel of this workspace ran" in notes, notes
            assert f"ivralo-kernel trust {workspace.resolve()}" in notes
        assert hits == []
        assert main(["trust", str(workspace)]) == 0  # the person approves the file as it is
        assert "Approved .ivralo/permissions.json" in capsys.readouterr().out
        async with Session(workspace=workspace, config=FALLBACK) as session:
            assert str(await session.run(GET.format(port=port, path="approved"))).startswith("200\n")
        assert hits == ["/approved"]


async def test_the_persons_edit_between_runs_is_used(workspace: Path) -> None:
    """Changed while no kernel ran: the person's, used as it is."""
    with counting_http() as (port, hits):
        async with Session(workspace=workspace, config=FALLBACK) as session:
            assert isinstance(await session.run("1 + 1"), str)
        (workspace / ".ivralo").mkdir(exist_ok=True)
        (workspace / ".ivralo" / "permissions.json").write_text(json.dumps({"hosts": {"allow": [f"127.0.0.1:{port}"]}}))
        async with Session(workspace=workspace, config=FALLBACK) as session:
            assert str(await session.run(GET.format(port=port, path="edited"))).startswith("200\n")
        assert hits == ["/edited"]


@pytest.mark.fast
def test_the_record_forgets_folders_that_are_gone_and_survives_a_torn_write(tmp_path: Path) -> None:
    """The record of changed files lives in the config home, one entry per workspace: a folder that
    no longer exists is dropped at the next start (it would grow with every folder ever used), and a
    record is replaced whole, never left half-written."""
    from ivralo_kernel.host.settings.workspace_files import RECORD_FILE, WorkspaceFiles

    env = {"IVRALO_CONFIG_HOME": str(tmp_path / "config")}
    kept, removed = tmp_path / "kept", tmp_path / "removed"
    for folder in (kept, removed):
        folder.mkdir()
        files = WorkspaceFiles(str(folder), env)
        files.begin()
        (folder / ".env").write_text("CHANGED=by the kernel\n")  # while "its kernel" runs
        files.end()
    record = tmp_path / "config" / RECORD_FILE
    assert set(json.loads(record.read_text())) == {str(kept), str(removed)}
    for child in removed.iterdir():
        child.unlink()
    removed.rmdir()
    WorkspaceFiles(str(kept), env).begin()
    assert set(json.loads(record.read_text())) == {str(kept)}, "the gone folder's entry stays"
    assert not list(record.parent.glob(".*.new")), "a temporary file of the replace was left"


def test_a_restart_after_a_crash_names_no_file_as_changed(workspace: Path) -> None:
    """The sandbox's placeholder for a missing databases.json (an empty file) is still there when a
    crashed kernel is restarted; it is no change of the kernel's (the restarter's banner said so)."""
    from conftest import wait_until
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="ivralo")
    km.start_kernel(cwd=str(workspace))
    try:
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        kc.execute("import os; os._exit(1)")
        wait_until(lambda: not km.is_alive(), 30, "the kernel's crash")
        kc.stop_channels()
        km.restart_kernel(now=True, newports=True)
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        banner = kc.kernel_info(reply=True)["content"]["banner"]
        kc.stop_channels()
        assert "was changed while a kernel" not in banner, banner
    finally:
        km.shutdown_kernel(now=True)
