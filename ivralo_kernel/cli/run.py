"""[cli] ``ivralo-kernel run FILE``: execute a notebook (or a .py file) in a guarded kernel, headless,
and print each cell with what it printed, the way a person reading the notebook would see it."""

from __future__ import annotations

import asyncio
import os
import textwrap
from pathlib import Path
from typing import Any

from ivralo_kernel.host.manager import IvraloKernelManager
from ivralo_kernel.host.outputs import CellOutput
from ivralo_kernel.host.processes import still_running, tree_of
from ivralo_kernel.protocol import IvraloError


def _settings(workspace: str, memory_limit: int | None, grants: tuple[str, ...]) -> dict[str, Any]:
    settings: dict[str, Any] = {"workspace": workspace, "grants": list(grants)}
    if memory_limit:
        settings["memory_limit_bytes"] = memory_limit
    return settings


def _print_cell(number: int, source: str, outputs: list[dict[str, Any]]) -> None:
    print(f"\033[1mIn [{number}]:\033[0m")
    print(textwrap.indent(source.rstrip() or "(empty)", "    "))
    collected = CellOutput()
    for output in outputs:
        kind = output.get("output_type")
        if kind == "stream":
            collected.parts.append(output.get("text", ""))
        elif kind in ("execute_result", "display_data"):
            text = output.get("data", {}).get("text/plain")
            if text:
                collected.parts.append(text + "\n")
        elif kind == "error":
            collected.parts.append("\n".join(output.get("traceback", [])) + "\n")
    text = collected.text.rstrip()
    if text:
        print(textwrap.indent(text, "  | ", lambda _: True))
    print()


async def _run_notebook(
    path: Path, workspace: str, memory_limit: int | None, timeout: float, grants: tuple[str, ...]
) -> int:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    km = IvraloKernelManager.for_settings(**_settings(workspace, memory_limit, grants))
    client = NotebookClient(nb, km=km, timeout=timeout, allow_errors=True, resources={"metadata": {"path": workspace}})
    tree: list[int] = []
    try:
        client.reset_execution_trackers()
        # What async_execute does, minus its teardown: the tree is looked at before shutdown.
        async with client.async_setup_kernel(cleanup_kc=False):
            for index, cell in enumerate(nb.cells):
                await client.async_execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
            tree = tree_of(getattr(km.provisioner, "pid", 0)) if km.provisioner else []
    finally:  # nbclient leaves a manager it was handed running: stop it, and the whole tree with it
        if client.kc is not None:
            client.kc.stop_channels()
        if km.has_kernel:
            await km.shutdown_kernel(now=False)
    failed = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        _print_cell(cell.get("execution_count") or 0, cell.source, cell.get("outputs", []))
        failed += any(o.get("output_type") == "error" for o in cell.get("outputs", []))
    print(f"ran {path.name}: {sum(c.cell_type == 'code' for c in nb.cells)} code cells, {failed} with an error")
    left = still_running(tree)
    print(f"after shutdown: {len(tree)} processes were in the kernel's tree, {len(left)} still running {left or ''}")
    return 0


async def _run_script(
    path: Path, workspace: str, memory_limit: int | None, timeout: float, grants: tuple[str, ...]
) -> int:
    from ivralo_kernel.host import Session, WorkerConfig

    config = WorkerConfig(deadline_ms=int(timeout * 1000), memory_limit_bytes=memory_limit)
    async with Session(workspace=workspace, config=config, grants=grants) as session:
        result = await session.run(path.read_text(encoding="utf-8"))
    if isinstance(result, str):
        print(result, end="")
        return 0
    print(result["result"], end="")
    print(result["error"])
    return 1


def run_file(
    file: str, workspace: str | None, memory_limit: int | None, timeout: float, grants: tuple[str, ...] = ()
) -> int:
    path = Path(file).resolve()
    if not path.is_file():
        raise IvraloError(f"{file}: no such file. Give the path of a .ipynb or .py file.")
    folder = os.path.realpath(workspace or path.parent)
    if path.suffix == ".ipynb":
        return asyncio.run(_run_notebook(path, folder, memory_limit, timeout, grants))
    if path.suffix == ".py":
        return asyncio.run(_run_script(path, folder, memory_limit, timeout, grants))
    raise IvraloError(f"{file}: not a notebook or a Python file. Give a .ipynb or .py file.")
