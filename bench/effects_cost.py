"""What collecting a cell's effects (``ivralo.effects``: files, hosts, calls, processes, RSS, CPU)
costs, in a workspace of 10,000 files, against the same kernel in an empty workspace.

Two numbers per workspace, over N ``pass`` cells through ``Session.run``:
- ``collect_ms``: the kernel's own time for the effects (begin + end of each cell), as it reports it;
- the round trip of ``Session.run("pass")`` (median), so the ratio shows what a caller sees.
The goal (issue 14): collect_ms <= 5 ms median with 10,000 files.

Run: ``.venv/bin/python bench/effects_cost.py [--cells N] [--files N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ivralo_kernel.host import Session, WorkerConfig

if TYPE_CHECKING:
    from harness_api import Context, Metric


def fill(folder: Path, files: int, per_folder: int = 100) -> None:
    for i in range(files):
        sub = folder / f"d{i // per_folder:03d}"
        sub.mkdir(exist_ok=True)
        (sub / f"f{i:05d}.txt").write_text("x")


async def measure(workspace: Path, cells: int) -> tuple[list[float], list[float]]:
    collect, trips = [], []
    async with Session(workspace=workspace, config=WorkerConfig(deadline_ms=None)) as session:
        # The watches are added in a thread after start: until then the effects say so.
        until = time.monotonic() + 60
        while "files_note" in (getattr(await session.run("pass"), "effects", None) or {"files_note": ""}):
            assert time.monotonic() < until, "the workspace's watches were never all added"
        for _ in range(cells):
            start = time.perf_counter()
            result = await session.run("pass")
            trips.append((time.perf_counter() - start) * 1000)
            effects = getattr(result, "effects", None)
            assert effects is not None and "files_note" not in effects, effects
            collect.append(float(effects["collect_ms"]))
    return collect, trips


async def alternate(workspaces: dict[str, Path], cells: int) -> dict[str, dict[str, list[float]]]:
    """Both sessions open; each cell runs in one, then in the other (the order alternating)."""
    from contextlib import AsyncExitStack

    samples: dict[str, dict[str, list[float]]] = {name: {"collect": [], "trip": []} for name in workspaces}
    async with AsyncExitStack() as stack:
        sessions = {
            name: await stack.enter_async_context(Session(workspace=folder, config=WorkerConfig(deadline_ms=None)))
            for name, folder in workspaces.items()
        }
        for session in sessions.values():  # until the watches are added (a thread after start)
            until = time.monotonic() + 60
            while "files_note" in (getattr(await session.run("pass"), "effects", None) or {"files_note": ""}):
                assert time.monotonic() < until, "the workspace's watches were never all added"
        names = list(workspaces)
        for i in range(cells):
            for name in names if i % 2 == 0 else names[::-1]:
                start = time.perf_counter()
                result = await sessions[name].run("pass")
                samples[name]["trip"].append((time.perf_counter() - start) * 1000)
                effects = getattr(result, "effects", None)
                assert effects is not None and "files_note" not in effects, effects
                samples[name]["collect"].append(float(effects["collect_ms"]))
    return samples


def harness(ctx: Context) -> list[Metric]:
    """A workspace of 10,000 files against an empty one, cell by cell (smoke: 200 files)."""
    from harness_api import Metric

    files, cells = ctx.pick(smoke=(200, 10), full=(10_000, 100))
    empty, full = ctx.root / "ws-empty", ctx.root / "ws-full"
    empty.mkdir()
    full.mkdir()
    fill(full, files)
    samples = asyncio.run(alternate({"empty": empty, "full": full}, cells))
    base = "the same in an empty workspace"
    return [
        Metric(
            "effects report",
            f"collect_ms per cell, {files:,} files",
            "ms",
            samples["full"]["collect"],
            samples["empty"]["collect"],
            baseline_label=base,
        ),
        Metric(
            "effects report",
            f"Session.run('pass'), {files:,} files",
            "ms",
            samples["full"]["trip"],
            samples["empty"]["trip"],
            baseline_label=base,
        ),
    ]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", type=int, default=200)
    parser.add_argument("--files", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as empty, tempfile.TemporaryDirectory() as full:
        fill(Path(full), args.files)
        rows = {}
        for name, folder in (("empty", empty), (f"{args.files} files", full), ("empty again", empty)):
            collect, trips = await measure(Path(folder), args.cells)
            rows[name] = (statistics.median(collect), max(collect), statistics.median(trips))
    print(f"{'workspace':<14} {'collect_ms median':>18} {'collect_ms max':>15} {'run(pass) median ms':>20}")
    for name, (median, worst, trip) in rows.items():
        print(f"{name:<14} {median:>18.3f} {worst:>15.3f} {trip:>20.2f}")


if __name__ == "__main__":
    asyncio.run(main())
