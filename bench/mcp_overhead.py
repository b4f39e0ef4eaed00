"""What the MCP server adds to a call: ``run_python("1+1")`` through ``ivralo-kernel mcp`` over stdio
(the SDK's own ``Client``, each protocol mode) against ``Session.run("1+1")`` in this process, in the
same run, pair by pair (the order alternating). The goal (issue 28): within 2 ms. Beside each pair, a
bare ``echo`` tool through the same SDK and stdio transport, no kernel behind it: the floor any MCP
server pays on this machine at this moment (on a loaded machine, it alone can pass 2 ms).

Run: ``.venv/bin/python bench/mcp_overhead.py [--calls N]``, or through the harness
(``bench/harness.py --only mcp_overhead``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ivralo_kernel.host import Session

if TYPE_CHECKING:
    from harness_api import Context, Metric

WARM_UP = 5  # calls each side before timing: the kernel's first cells and the imports they pull in
MODES = ("legacy", "auto")
GOAL_MS = 2.0  # issue 28, Must 8


# The floor: the SDK's server on ivralo's stdio transport (mcp_stdio.py), one tool that returns its text.
ECHO_SERVER = """
import asyncio
from mcp.server import MCPServer
from ivralo_kernel.host.agent.mcp_serve import _run_stdio
server = MCPServer("echo")
@server.tool()
async def echo(code: str) -> str:
    return code
asyncio.run(_run_stdio(server))
"""


def added_ms(over_mcp: list[float], direct: list[float]) -> float:
    """What the server adds to a call: the median of the pairs' differences."""
    return statistics.median(a - b for a, b in zip(over_mcp, direct, strict=True))


async def paired(workspace: Path, mode: str, calls: int) -> tuple[list[float], list[float], list[float]]:
    """(run_python over MCP, Session.run, the bare echo tool) in ms, ``calls`` of each, interleaved."""
    from mcp import Client, StdioServerParameters

    command = [sys.executable, "-m", "ivralo_kernel", "mcp", "--workspace", str(workspace / "mcp")]
    (workspace / "mcp").mkdir(exist_ok=True)
    (workspace / "session").mkdir(exist_ok=True)
    params = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
    echo_params = StdioServerParameters(command=sys.executable, args=["-c", ECHO_SERVER], env=dict(os.environ))
    over_mcp: list[float] = []
    direct: list[float] = []
    floor: list[float] = []
    async with (
        Client(params, mode=mode) as client,
        Client(echo_params, mode=mode) as echo_client,
        Session(workspace / "session") as session,
    ):

        async def through_mcp() -> float:
            start = time.perf_counter()
            result = await client.call_tool("run_python", {"code": "1+1"})
            took = (time.perf_counter() - start) * 1000
            assert not result.is_error and result.structured_content is not None
            assert result.structured_content["result"] == "2\n", result
            return took

        async def in_process() -> float:
            start = time.perf_counter()
            result = await session.run("1+1")
            took = (time.perf_counter() - start) * 1000
            assert result == "2\n", result
            return took

        async def bare_echo() -> float:
            start = time.perf_counter()
            result = await echo_client.call_tool("echo", {"code": "1+1"})
            took = (time.perf_counter() - start) * 1000
            assert not result.is_error, result
            return took

        for _ in range(WARM_UP):
            await through_mcp()
            await in_process()
            await bare_echo()
        for i in range(calls):
            if i % 2 == 0:
                over_mcp.append(await through_mcp())
                direct.append(await in_process())
            else:
                direct.append(await in_process())
                over_mcp.append(await through_mcp())
            floor.append(await bare_echo())
    return over_mcp, direct, floor


def harness(ctx: Context) -> list[Metric]:
    from harness_api import LATENCY, Metric

    calls = ctx.pick(smoke=20, full=400)  # the pairs are noisy on a shared machine
    metrics = []
    for mode in MODES:
        folder = ctx.root / f"ws-{mode}"
        folder.mkdir()
        over_mcp, direct, floor = asyncio.run(paired(folder, mode, calls))
        metrics.append(
            Metric(
                "MCP server",
                f"run_python('1+1') over stdio, {mode} mode",
                "ms",
                over_mcp,
                direct,
                baseline_label="Session.run('1+1') in the same run",
                plot=LATENCY,
                note=f"what MCP adds, the median of the paired differences: {added_ms(over_mcp, direct):.2f} ms "
                f"(goal: within {GOAL_MS:.0f} ms); a bare echo tool through the SDK, the floor: "
                f"{statistics.median(floor):.2f} ms",
            )
        )
        metrics.append(Metric("MCP server", f"a bare echo tool over stdio (the SDK's floor), {mode} mode", "ms", floor))
    return metrics


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    print(
        f"{'mode':<8} {'run_python median ms':>21} {'Session.run median ms':>22} {'paired diff median':>19} "
        f"{'echo floor median':>18}"
    )
    for mode in MODES:
        with tempfile.TemporaryDirectory() as folder:
            over_mcp, direct, floor = await paired(Path(folder), mode, args.calls)
        diff = added_ms(over_mcp, direct)
        print(
            f"{mode:<8} {statistics.median(over_mcp):>21.2f} {statistics.median(direct):>22.2f} {diff:>19.2f} "
            f"{statistics.median(floor):>18.2f}"
        )


if __name__ == "__main__":
    asyncio.run(main())
