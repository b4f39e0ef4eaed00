"""Every notebook in notebooks/ runs without an error, the way `make demo` runs it, so none can rot.

The glob picks a new notebook up by itself; its kernelspec says how it runs:
- ``ivralo`` (tour.ipynb, broker.ipynb): ``ivralo-kernel run`` in a guarded kernel, with the demo's
  set-up (notebooks/demo_data.py's database, notebooks/demo_api.py's loopback API, both credentials in
  the host's environment only, the grants ``databases`` and ``shop``), as the Makefile's ``demo`` does;
- ``python3`` (agent.ipynb): a plain Python kernel through nbclient; the notebook drives ``Session``,
  which starts its own ivralo kernels.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
BIN = Path(sys.executable).parent
RUN_TIMEOUT_S = 100  # each notebook: a few kernel starts and a 2 s deadline or two, on a busy 2-core machine


def kernel_of(path: Path) -> str:
    return str(nbformat.read(path, as_version=4).metadata.get("kernelspec", {}).get("name", ""))


def test_the_glob_finds_the_showcase() -> None:
    assert {p.name for p in NOTEBOOKS} >= {"tour.ipynb", "broker.ipynb", "agent.ipynb"}
    for path in NOTEBOOKS:  # a notebook this file does not know how to run fails here, not silently
        assert kernel_of(path) in ("ivralo", "python3"), f"{path.name}: kernelspec {kernel_of(path)!r}"


def run_guarded(path: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """What `make demo` does for a notebook on the ivralo kernel."""
    data, config, workspace = tmp_path / "demo-data", tmp_path / "demo-data" / "config", tmp_path / "workspace"
    workspace.mkdir()
    subprocess.run(
        [sys.executable, str(ROOT / "notebooks/demo_data.py"), str(data / "shop.db"), str(config)], check=True
    )
    env = {
        **os.environ,
        "DEMO_API_KEY": "sk-demo-not-for-the-kernel",
        "DEMO_SHOP_DB_URL": f"sqlite:///{data / 'shop.db'}",
        "IVRALO_CONFIG_HOME": str(config),
    }
    run = [str(BIN / "ivralo-kernel"), "run", str(path), "--workspace", str(workspace)]
    run += ["--memory-limit", "1073741824", "--grant", "databases", "--grant", "shop"]
    command = [sys.executable, str(ROOT / "notebooks/demo_api.py"), str(config), "--", *run]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def run_plain(path: Path, tmp_path: Path) -> list[str]:
    """A notebook on the plain python3 kernel, through nbclient; returns its error outputs' texts."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, kernel_name="python3", timeout=RUN_TIMEOUT_S, allow_errors=True, resources={"metadata": {"path": tmp_path}}
    )
    client.execute()
    return [
        f"cell {index}: {output.get('ename')}: {output.get('evalue')}"
        for index, cell in enumerate(nb.cells)
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]


@pytest.mark.timeout(RUN_TIMEOUT_S + 20)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_the_notebook_runs_without_an_error(path: Path, tmp_path: Path) -> None:
    if kernel_of(path) == "python3":
        assert run_plain(path, tmp_path) == []
        return
    done = run_guarded(path, tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " code cells, 0 with an error" in done.stdout, done.stdout[-2000:]
    assert "Traceback" not in done.stdout, done.stdout
    assert "sk-demo-not-for-the-kernel" not in done.stdout  # the key stays with the host


def test_the_broker_notebook_shows_its_record_lines(tmp_path: Path) -> None:
    """What broker.ipynb is for: the API answered (with the host's key), the database answered, and
    the record line names both credentials."""
    done = run_guarded(ROOT / "notebooks/broker.ipynb", tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    out = done.stdout
    assert "  | 200 {'item': 'scone', 'in_stock': 12}" in out, out
    assert "  | {'name': 'bagel', 'price': 2.2}" in out, out
    assert (
        "[ivralo answered this code's calls: shop database with DEMO_SHOP_DB_URL (1 call, 0.0s), "
        "shop.stock with DEMO_API_KEY (2 calls, " in out
    ), out
    assert "ivralo: 3 brokered calls;" in out, out
    assert 'refused: this kernel has no "photos" grant' in out, out
    assert "DEMO_API_KEY in os.environ:     False" in out, out
