"""[cli] ``ivralo-kernel run FILE``: execute a notebook (or a .py file) in a guarded kernel, headless,
and print each cell with what it printed, the way a person reading the notebook would see it.

A notebook and a .py file take the same path (a .py file is one cell), so each flag means one thing
for both: ``--deadline-ms`` is the host's per-execution deadline (interrupt, then kill the tree after
the grace), and the run exits 1 when any cell failed, like ``jupyter nbconvert --execute``. Unlike
nbconvert, every cell still runs after a failure, so the report shows all of them.
"""

from __future__ import annotations

import asyncio
import math
import os
import sys
import textwrap
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ivralo_kernel.cli.progress import Mode, Progress
from ivralo_kernel.host.agent.outputs import CellOutput, effects_in, effects_line
from ivralo_kernel.host.jupyter.manager import IvraloKernelManager
from ivralo_kernel.host.watch.processes import still_running, tree_of
from ivralo_kernel.protocol import IvraloError, names
from ivralo_kernel.protocol.messages import Effects
from ivralo_kernel.protocol.terminal import terminal_safe

# nbclient's own wait for a cell's reply is only a backstop: the host's deadline is what ends a cell
# (at deadline_ms, then the kill after the grace, answered within 250 ms), so nbclient waits longer.
NBCLIENT_MARGIN_S = 30.0


def _nbclient_timeout(km: IvraloKernelManager) -> int | None:
    """None without a deadline (nbclient's own default, and nbconvert's); else past the host's bound.
    The provisioner's own values: a deadline from the config files counts as well as the flag's."""
    deadline_ms: int | None = getattr(km.provisioner, "deadline_ms", None)
    if deadline_ms is None:
        return None
    grace_ms = int(getattr(km.provisioner, "interrupt_grace_ms", 2_000))
    return math.ceil((deadline_ms + grace_ms) / 1000 + NBCLIENT_MARGIN_S)


def _cell_text(outputs: list[dict[str, Any]]) -> str:
    return CellOutput.from_notebook(outputs).shown


def _styles() -> tuple[str, str, str]:
    """Bold, dim and reset on a terminal; nothing on a pipe or in a file (a log holds no escapes)."""
    try:
        tty = sys.stdout.isatty()
    except (AttributeError, ValueError):
        tty = False
    return ("\033[1m", "\033[2m", "\033[0m") if tty else ("", "", "")


def _print_cell(number: int, source: str, outputs: list[dict[str, Any]], effects: Effects | None) -> None:
    bold, dim, reset = _styles()
    print(f"{bold}In [{number}]:{reset}")
    # What the cells printed, the files they wrote and the hosts they tried are the kernel's to choose:
    # escaped (terminal_safe), so only this report's own bold and dim reach the terminal.
    print(textwrap.indent(terminal_safe(source.rstrip(), keep_newlines=True) or "(empty)", "    "))
    text = terminal_safe(_cell_text(outputs).rstrip(), keep_newlines=True)
    if text:
        print(textwrap.indent(text, "  | ", lambda _: True))
    if effects is not None:
        print(f"  {dim}ivralo: {terminal_safe(effects_line(effects))}{reset}")
    print()


def _effects_of(cell: Any) -> Effects | None:
    return effects_in(cell.get("metadata"))


def _keep_effects(cell: Any, cell_index: int, execute_reply: dict[str, Any]) -> None:
    """(nbclient's hook) The reply's ``ivralo.effects``, kept with the cell for its summary line."""
    effects = effects_in((execute_reply or {}).get("metadata"))
    if effects is not None:
        cell.setdefault("metadata", {}).setdefault(names.KERNEL_INFO_SECTION, {})["effects"] = effects


def _failed(cell: Any) -> bool:
    return any(o.get("output_type") == "error" for o in cell.get("outputs", []))


def _killed(cell: Any) -> bool:
    """The host killed this cell's kernel (deadline, memory) and answered the cell in its place."""
    return any(o.get("ename") == "KernelKilled" for o in cell.get("outputs", []))


async def _fresh_kernel(client: Any, km: IvraloKernelManager, replaced: int) -> None:
    """Wait for the kernel the host starts in the killed one's place, so that the next cell runs
    there (sent sooner, it would be answered "did not run")."""
    deadline = time.monotonic() + client.startup_timeout
    while getattr(km.provisioner, "replacements", replaced) == replaced:
        if time.monotonic() > deadline or not await km.is_alive():
            return  # no replacement came: the next cell meets whatever is there, and says so
        await asyncio.sleep(0.05)
    await client.kc.wait_for_ready(timeout=client.startup_timeout)


async def _execute(
    nb: Any, workspace: str, settings: Mapping[str, Any], progress: Progress | None = None
) -> tuple[list[int], str | None]:
    """Run every code cell of ``nb`` in place; return the kernel's tree (as it was before shutdown)
    and why the run stopped early, if it did (the kernel died, or nbclient's backstop fired)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    km = IvraloKernelManager.for_settings(**{**settings, "workspace": workspace})
    client = NotebookClient(
        nb, km=km, allow_errors=True, resources={"metadata": {"path": workspace}}, on_cell_executed=_keep_effects
    )
    tree: list[int] = []
    stopped = None
    try:
        client.reset_execution_trackers()
        # What async_execute does, minus its teardown: the tree is looked at before shutdown.
        async with client.async_setup_kernel(cleanup_kc=False):
            client.timeout = _nbclient_timeout(km)
            number = 0  # of code cells, as the progress counts them
            for index, cell in enumerate(nb.cells):
                replaced = getattr(km.provisioner, "replacements", 0)
                code = cell.cell_type == "code"
                if code:
                    number += 1
                    if progress is not None:
                        progress.start(number, cell.source)
                try:
                    await client.async_execute_cell(cell, index, execution_count=client.code_cells_executed + 1)
                    if _killed(cell):
                        await _fresh_kernel(client, km, replaced)
                except (CellTimeoutError, DeadKernelError) as exc:
                    stopped = f"cell {index + 1}: {type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
                    if code and progress is not None:
                        progress.done(number, "stopped")
                    break
                if code and progress is not None:
                    progress.done(number, "killed" if _killed(cell) else "error" if _failed(cell) else "ok")
            tree = tree_of(getattr(km.provisioner, "pid", 0)) if km.provisioner else []
    finally:  # nbclient leaves a manager it was handed running: stop it, and the whole tree with it
        if progress is not None:
            progress.finish()
        if client.kc is not None:
            client.kc.stop_channels()
        if km.has_kernel:
            await km.shutdown_kernel(now=False)
    return tree, stopped


async def _run_notebook(path: Path, workspace: str, settings: Mapping[str, Any], progress: Mode) -> int:
    import nbformat

    nb = nbformat.read(path, as_version=4)
    total = sum(cell.cell_type == "code" for cell in nb.cells)
    tree, stopped = await _execute(nb, workspace, settings, Progress(total, progress))
    code_cells = [cell for cell in nb.cells if cell.cell_type == "code"]
    for cell in code_cells:
        _print_cell(cell.get("execution_count") or 0, cell.source, cell.get("outputs", []), _effects_of(cell))
    failed = sum(_failed(cell) for cell in code_cells)
    print(f"ran {path.name}: {len(code_cells)} code cells, {failed} with an error")
    left = still_running(tree)
    print(f"after shutdown: {len(tree)} processes were in the kernel's tree, {len(left)} still running {left or ''}")
    if stopped:
        print(f"ivralo-kernel run: {path.name}: stopped at {stopped}", file=sys.stderr)
        return 1
    if failed:
        print(f"ivralo-kernel run: {path.name}: {failed} of {len(code_cells)} code cells failed", file=sys.stderr)
        return 1
    return 0


async def _run_script(path: Path, workspace: str, settings: Mapping[str, Any]) -> int:
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(path.read_text(encoding="utf-8"))])
    _, stopped = await _execute(nb, workspace, settings)
    print(terminal_safe(_cell_text(nb.cells[0].get("outputs", [])), keep_newlines=True), end="")
    effects = _effects_of(nb.cells[0])
    if effects is not None:  # stdout stays the script's own
        print(f"ivralo: {terminal_safe(effects_line(effects))}", file=sys.stderr)
    if stopped:
        print(f"ivralo-kernel run: {path.name}: stopped at {stopped}", file=sys.stderr)
    return 1 if stopped or _failed(nb.cells[0]) else 0


def run_file(
    file: str, workspace: str | None, settings: Mapping[str, Any] | None = None, progress: Mode = "auto"
) -> int:
    """Run ``file``; 0 when every cell ran without an error, else 1. ``settings``: the kernel's, over
    the config files' (IvraloSettings' names: deadline_ms, memory_limit_bytes, grants, ...).
    ``progress``: a notebook's per-cell progress on stderr (auto: a bar on a terminal, plain lines
    otherwise); a .py file is one cell and shows none, its stderr stays the script's."""
    path = Path(file).resolve()
    if not path.is_file():
        raise IvraloError(f"{file}: no such file. Give the path of a .ipynb or .py file.")
    folder = os.path.realpath(workspace or path.parent)
    if path.suffix == ".ipynb":
        return asyncio.run(_run_notebook(path, folder, settings or {}, progress))
    if path.suffix == ".py":
        return asyncio.run(_run_script(path, folder, settings or {}))
    raise IvraloError(f"{file}: not a notebook or a Python file. Give a .ipynb or .py file.")
