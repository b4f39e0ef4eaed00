"""What the kernel process enforces on itself: credential scrub (again after .env), memory cap,
the workspace as working directory, no bytecode, and a workspace that cannot shadow our modules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jupyter_client import KernelManager
from kernel_helpers import execute

PROBE_ENV = """
import json, os, subprocess
names = {names!r}
child = subprocess.run(['env'], capture_output=True, text=True).stdout
proc = open('/proc/self/environ', 'rb').read().decode(errors='replace')
print(json.dumps({{
    'environ': [n for n in names if n in os.environ],
    'proc': [n for n in names if n + '=' in proc],
    'child': [n for n in names if n + '=' in child],
    'values_seen': [v for v in {values!r} if v in proc or v in child or v in repr(dict(os.environ))],
    'kept': os.environ.get('IVRALO_TEST_PLAIN'), 'from_dotenv': os.environ.get('FROM_DOTENV'),
}}))
"""


def start(workspace: Path, **env: str):
    km = KernelManager(kernel_name="ivralo")
    km.start_kernel(cwd=str(workspace), env={**__import__("os").environ, **env})
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    return km, kc


def test_credentials_never_reach_the_kernel(workspace: Path) -> None:
    (workspace / "databases.json").write_text(json.dumps({"sales": {"url_env": "SALES_DB_URL"}}))
    (workspace / ".env").write_text("DOTENV_API_TOKEN=from-dotenv-secret\nFROM_DOTENV=plain-value\n")
    secrets = {
        "IVRALO_TEST_API_KEY": "sk-host-secret-1",
        "IVRALO_TEST_DB_PASSWORD": "pw-host-secret-2",
        "SLACK_WEBHOOK_URL": "https://hooks.invalid/secret-3",
        "SALES_DB_URL": "postgresql://u:pw-secret-4@127.0.0.1/sales",
        "IVRALO_SQL_URL": "sqlite:///secret-5.db",
    }
    km, kc = start(workspace, IVRALO_TEST_PLAIN="visible", **secrets)
    try:
        names = [*secrets, "DOTENV_API_TOKEN"]
        values = [*secrets.values(), "from-dotenv-secret"]
        seen = json.loads(execute(kc, PROBE_ENV.format(names=names, values=values)).stdout)
        assert seen == {
            "environ": [],
            "proc": [],
            "child": [],
            "values_seen": [],
            "kept": "visible",
            "from_dotenv": "plain-value",
        }
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_memory_error_instead_of_death(tmp_path: Path, workspace: Path) -> None:
    from ivralo_kernel.host import SyncSession, WorkerConfig

    with SyncSession(workspace=workspace, config=WorkerConfig(memory_limit_bytes=1 << 30)) as session:
        assert session.run("keep = list(range(10))\nprint(len(keep))") == "10\n"
        result = session.run("big = bytearray(4 << 30)")
        assert isinstance(result, dict) and result["status"] == "error"
        assert "MemoryError" in result["error"]
        assert session.run("print(sum(keep))") == "45\n", "the kernel and its variables stay up"
        limits = session.run("import resource; print(resource.getrlimit(resource.RLIMIT_DATA))")
        assert limits == f"({1 << 30}, {1 << 30})\n", "soft = hard, so the cell cannot raise it"
        core = session.run("print(resource.getrlimit(resource.RLIMIT_CORE))")
        assert core == "(0, 0)\n"


def test_workspace_is_cwd_and_no_bytecode_is_written(workspace: Path) -> None:
    from ivralo_kernel.protocol.trust import set_trust

    set_trust(str(workspace), True, __import__("os").environ)  # its own modules are imported only if trusted
    (workspace / "helper_mod.py").write_text("VALUE = 7\n")
    # a file named like a stdlib module the kernel relies on must not shadow it during start-up
    (workspace / "socket.py").write_text("raise RuntimeError('workspace socket.py was imported')\n")
    km, kc = start(workspace)
    try:
        out = execute(
            kc,
            "import os, sys, subprocess\nimport helper_mod\n"
            "subprocess.run([sys.executable, '-c', 'import helper_mod'], check=True)\n"
            "print(os.getcwd(), helper_mod.VALUE, sys.path.index(''), sys.dont_write_bytecode)",
        )
        cwd, value, index, no_bytecode = out.stdout.split()
        assert cwd == str(workspace.resolve()) and value == "7" and no_bytecode == "True"
        assert int(index) > 0, "the workspace is on sys.path after the standard library, never first"
        assert not list(workspace.rglob("__pycache__")), "no bytecode was written in the workspace"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_configured_workspace_wins_over_the_launch_folder(tmp_path: Path, workspace: Path) -> None:
    from ivralo_kernel.host import IvraloKernelManager

    elsewhere = tmp_path / "launched-here"
    elsewhere.mkdir()
    km = IvraloKernelManager.for_settings(workspace=str(workspace))
    import asyncio

    async def probe() -> str:
        await km.start_kernel(cwd=str(elsewhere))
        try:
            kc = km.client()
            kc.start_channels()
            await kc.wait_for_ready(timeout=60)
            reply = await kc.kernel_info(reply=True, timeout=10)
            kc.stop_channels()
            return str(reply["content"]["ivralo"]["workspace"])
        finally:
            await km.shutdown_kernel(now=True)

    assert asyncio.run(probe()) == str(workspace.resolve())


@pytest.mark.parametrize("role", ["specialist", "readonly"])
def test_role_is_reported(workspace: Path, role: str) -> None:
    from ivralo_kernel.host import SyncSession

    with SyncSession(workspace=workspace, role=role) as session:
        assert session.run("print(get_ipython().kernel.kernel_info['ivralo']['role'])") == f"{role}\n"
