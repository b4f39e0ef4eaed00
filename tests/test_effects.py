"""What each call did (``ivralo.effects`` in every execute_reply's metadata), checked against what
really happened: the files on disk, the history's copies, a refused host, a brokered call, and the
line ``ivralo-kernel run`` prints per cell."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from ivralo_kernel.cli.app import main
from ivralo_kernel.host import Session
from ivralo_kernel.host.history.store import HistoryStore

WRITES = """
open('kept.txt', 'w').write('new')                 # Python overwrites: the old one is kept first
import os, subprocess
os.remove('gone.txt')                              # Python deletes
subprocess.run(['sh', '-c', 'echo hi > by-sh.txt; mkdir made; echo x > made/inner.txt; rm -f tmp.txt'])
open('scratch.txt', 'w').close(); os.remove('scratch.txt')   # made and gone within the cell: no effect
print('done')
"""


async def test_effects_of_python_and_sh_writes_and_a_delete(workspace: Path) -> None:
    (workspace / "kept.txt").write_text("old")
    (workspace / "gone.txt").write_text("gone")
    async with Session(workspace=workspace) as session:
        assert await session.run("x = 1") == ""
        result = await session.run(WRITES)
    assert result == "done\n"
    effects = result.effects  # type: ignore[union-attr]
    assert effects is not None
    files = effects["files"]
    # Judged against the disk: what exists now, what is gone.
    assert (workspace / "by-sh.txt").exists() and (workspace / "made/inner.txt").exists()
    assert not (workspace / "gone.txt").exists() and not (workspace / "scratch.txt").exists()
    assert files == {"created": ["by-sh.txt", "made/inner.txt"], "changed": ["kept.txt"], "deleted": ["gone.txt"]}
    # The history's copies of what was overwritten and deleted, by the id `ivralo-kernel history` takes.
    store = HistoryStore(workspace)
    assert set(effects["history"]) == {"kept.txt", "gone.txt"}
    assert store.read(store.find(effects["history"]["kept.txt"]))[0] == b"old"
    assert store.read(store.find(effects["history"]["gone.txt"]))[0] == b"gone"
    assert effects["processes"] == ["sh"]
    assert effects["peak_rss_bytes"] > 10 << 20 and effects["wall_s"] >= 0 and effects["collect_ms"] >= 0


async def test_a_cell_that_touches_nothing_has_no_file_effects(workspace: Path) -> None:
    async with Session(workspace=workspace) as session:
        await session.run("1")
        (workspace / "edited-by-the-person.txt").write_text("between cells")  # not the next cell's doing
        result = await session.run("print(2)")
    effects = result.effects  # type: ignore[union-attr]
    assert effects is not None
    assert effects["files"] == {"created": [], "changed": [], "deleted": []}
    assert effects["hosts"] == {} and effects["calls"] == [] and effects["processes"] == []


async def test_effects_of_a_refused_host_and_a_brokered_call(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shop = workspace / "shop.sqlite"
    with sqlite3.connect(shop) as db:
        db.execute("create table items (name text)")
        db.execute("insert into items values ('pen')")
    db.close()
    monkeypatch.setenv("SHOP_DB_URL", f"sqlite:///{shop}")
    monkeypatch.setenv("IVRALO_CONFIG_HOME", str(tmp_path / "config-home"))
    (workspace / "databases.json").write_text(json.dumps({"shop": "SHOP_DB_URL"}))
    code = (
        "import urllib.request\n"
        "try:\n    urllib.request.urlopen('http://localhost:9/', timeout=5)\n"
        "except OSError as exc:\n    print('refused')\n"
        "print(ivralo.sql('shop', 'select name from items'))"
    )
    async with Session(workspace=workspace, grants=("databases",)) as session:  # ask=None: nobody to ask
        result = await session.run(code)
    assert isinstance(result, str) and result.startswith("refused\n"), result
    effects = result.effects  # type: ignore[attr-defined]
    assert list(effects["hosts"]) == ["localhost"] and effects["hosts"]["localhost"].startswith("refused")
    assert [(c["what"], c["credential"]) for c in effects["calls"]] == [("shop database", "SHOP_DB_URL")]


def test_run_prints_what_each_cell_did(workspace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import nbformat

    notebook = workspace / "effects.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("open('out.csv', 'w').write('a,b\\n')"),
        nbformat.v4.new_code_cell("import os\nos.system('echo x > shell.txt')"),
    ]
    nbformat.write(nb, notebook)
    assert main(["run", str(notebook)]) == 0
    out = capsys.readouterr().out
    lines = [line.strip() for line in out.splitlines() if "ivralo: " in line]
    assert len(lines) == 2, out
    assert "1 file created (out.csv)" in lines[0], lines
    assert "1 file created (shell.txt)" in lines[1] and "ran sh" in lines[1], lines


async def test_the_peak_rss_counts_what_a_subprocess_holds(workspace: Path) -> None:
    """A cell whose memory is in a child process (a tool, ``!sh``, a multiprocessing worker): the peak
    is the tree's, not the kernel's alone."""
    child = "b = b'x' * (200 << 20); import time; time.sleep(1)"
    holds = f"import subprocess, sys\n_ = subprocess.run([sys.executable, '-c', {child!r}])"
    async with Session(workspace=workspace) as session:
        alone = (await session.run("1")).effects  # type: ignore[union-attr]
        result = await session.run(holds)
    assert alone is not None and result == "", result
    effects = result.effects  # type: ignore[union-attr]
    assert effects is not None
    assert effects["peak_rss_bytes"] > alone["peak_rss_bytes"] + (150 << 20), (effects, alone)


async def test_the_peak_rss_starts_from_the_last_cells_end(workspace: Path) -> None:
    """A cell's peak begins at the tree's RSS when the last cell ended (read once per cell, not at
    each start): memory a cell frees still counts for it, and is gone from the cell after."""
    async with Session(workspace=workspace) as session:
        alone = (await session.run("1")).effects  # type: ignore[union-attr]
        held = (await session.run("big = b'x' * (200 << 20)")).effects  # type: ignore[union-attr]
        freed = (await session.run("del big")).effects  # type: ignore[union-attr]
        after = (await session.run("1")).effects  # type: ignore[union-attr]
    assert alone and held and freed and after
    grown = 150 << 20
    assert held["peak_rss_bytes"] > alone["peak_rss_bytes"] + grown, (held, alone)
    assert freed["peak_rss_bytes"] > alone["peak_rss_bytes"] + grown, (freed, alone)
    assert after["peak_rss_bytes"] < alone["peak_rss_bytes"] + (50 << 20), (after, alone)
