"""``%apropos WORD`` / ``%doc NAME`` and ``Session.apropos`` / ``Session.doc``: what the kernel's
surface offers, asked of the surface itself: helpers, brokered operations and databases with their
grants, hosts code may reach, importable modules (the hermetic surface offers no installed package)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from kernel_helpers import execute

from ivralo_kernel.host import Session


@pytest.fixture
def shop(workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = workspace / "shop.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("create table items (name text)")
    db.close()
    monkeypatch.setenv("SHOP_DB_URL", f"sqlite:///{path}")
    monkeypatch.setenv("IVRALO_CONFIG_HOME", str(tmp_path / "config-home"))
    (workspace / "databases.json").write_text(json.dumps({"shop": "SHOP_DB_URL"}))
    (workspace / ".ivralo").mkdir(exist_ok=True)
    (workspace / ".ivralo" / "permissions.json").write_text(json.dumps({"hosts": {"allow": ["localhost:8123"]}}))
    return path


async def test_the_project_surface_says_what_it_offers(workspace: Path, shop: Path) -> None:
    async with Session(workspace=workspace, grants=("databases",)) as session:
        listed = await session.apropos("shop")
        assert "  shop (granted)" in listed, listed
        hosts = await session.apropos("localhost")
        assert "  localhost:8123" in hosts, hosts
        helpers = await session.apropos("sql")
        assert "  ivralo.sql:" in helpers, helpers
        modules = await session.apropos("pandas")
        assert "  pandas" in modules, modules  # an installed package: the project surface has it
        assert (await session.doc("ivralo.sql")).startswith("ivralo.sql(")
        assert "read-only database" in await session.doc("shop")
        missing = await session.doc("no_such_thing_here")
        assert missing.startswith("no_such_thing_here: not offered by this kernel's project surface"), missing


async def test_the_hermetic_surface_offers_no_installed_package(workspace: Path) -> None:
    async with Session(workspace=workspace, surface="hermetic") as session:
        modules = await session.apropos("pandas")
        assert "importable modules:\n  (none)" in modules, modules
        assert "  json" in await session.apropos("json")
        assert "The project surface offers different modules" in await session.doc("pandas")


def test_the_magics_in_a_notebook_kernel(kc: BlockingKernelClient) -> None:
    shown = execute(kc, "%apropos json").stdout
    assert shown.startswith("What this kernel offers (project surface) matching 'json':"), shown
    assert "helpers:" in shown and "  json" in shown
    assert execute(kc, "%doc ivralo.call").stdout.startswith("ivralo.call(")
