"""A bad workspace file never stops a kernel (issue 30, Must 3): code in the kernel can leave any
bytes in the workspace's `.env`, `databases.json` and `.ivralo/permissions.json`. Each is set aside
and named in the banner, with the line and what to do, and the kernel starts and runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from kernel_helpers import execute


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A folder whose three settings files were each spoiled as a cell could spoil them."""
    ws = tmp_path / "workspace"
    (ws / ".ivralo").mkdir(parents=True)
    (ws / ".env").write_bytes(b"FROM_DOTENV=1\nBROKEN=a\0b\n")
    (ws / "databases.json").write_bytes(b'{\n "shop": {"url_env": "SHOP_URL"},\n "\xff": 1\n}\n')
    (ws / ".ivralo" / "permissions.json").write_bytes(b'{"hosts":\n {"allow": ["example.org",]}}\n')
    return ws


def test_each_bad_file_is_named_in_the_banner_and_the_kernel_runs(workspace: Path, kc: BlockingKernelClient) -> None:
    banner = kc.kernel_info(reply=True)["content"]["banner"]
    then = "fix it, then restart the kernel"
    assert f"{workspace}/.env was set aside: line 2 holds a NUL byte" in banner, banner
    assert f"{workspace}/databases.json: line 3: not UTF-8 text; it was set aside: {then}" in banner, banner
    expected = f"{workspace}/.ivralo/permissions.json: line 2: not valid JSON"
    assert expected in banner and banner.count(then) == 2, banner
    ran = execute(kc, "import os; print(1 + 1, os.environ.get('FROM_DOTENV'))")
    assert ran.status == "ok" and ran.stdout == "2 None\n", ran
