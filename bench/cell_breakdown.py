"""Where a ``1+1`` round trip's extra time over plain ipykernel goes: the same round trip (reply and
idle, as ``startup_latency``'s row) on plain ipykernel and on ivralo kernels with one part of the
per-cell work switched off each, all open at once, one trip per kernel in turn, so the machine's
drift lands on every kind alike.

Kinds:
- ``plain``: ipykernel (``python3``), the baseline;
- ``ivralo``: the defaults (sandbox, channel relay, effects report, deadline);
- ``no effects``: the same kernel after a cell set its ``_effects`` recorder to None (no tree-RSS
  readings, no inotify read, no ``ivralo.effects`` in the reply's metadata);
- ``no deadline``: after a cell set the kernel's supervisor backstop and watchdog to None (no
  ``KillAt`` line to the supervisor at each cell's start and end, no watchdog thread's wake-ups);
- ``no effects, no deadline``: both;
- ``no sandbox``: ``sandbox="off"`` (no bwrap, no channel relay: the client talks to the kernel's
  own sockets), effects and deadline on.

The differences between the medians say what each part costs a caller; what is left between
``no effects, no deadline`` and ``plain`` is the sandbox's relay hop plus the guards (audit hooks on
each import and open) and ivralo's ``do_execute`` wrapper. Diagnostic only: ``make bench`` does not
run it.

Run: ``.venv/bin/python bench/cell_breakdown.py [--trips N]`` (~1 min at the default 200).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

SWITCHES = {
    "ivralo": "",
    "no effects": "get_ipython().kernel._effects = None",
    "no deadline": "get_ipython().kernel._backstop = None; get_ipython().kernel._watchdog = None",
    "no effects, no deadline": (
        "get_ipython().kernel._effects = None; get_ipython().kernel._backstop = None; "
        "get_ipython().kernel._watchdog = None"
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trips", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ivralo-cell-breakdown-") as tmp:
        root = Path(tmp)
        from startup_latency import Bench, await_reply, install_spec_with, isolate_jupyter, shutdown

        isolate_jupyter(root / "jupyter")
        install_spec_with("ivralo-nosandbox", sandbox="off")
        workspace = root / "workspace"
        workspace.mkdir()
        runtime = root / "runtime"
        runtime.mkdir()
        with open(root / "kernels.log", "wb") as log:
            bench = Bench(workspace, runtime, log, timeout=60)
            bench.kernel_names.update({name: "ivralo" for name in SWITCHES})
            bench.kernel_names["no sandbox"] = "ivralo-nosandbox"
            kinds = ["plain", *SWITCHES, "no sandbox"]
            started: dict[str, tuple[Any, Any]] = {}
            try:
                for kind in kinds:
                    km = bench.new_manager(kind)
                    started[kind] = (km, None)
                    kc, _ = bench.start(km)
                    started[kind] = (km, kc)
                    if SWITCHES.get(kind):
                        reply = await_reply(kc, kc.execute(SWITCHES[kind]), 60)
                        assert reply["content"]["status"] == "ok", reply["content"]
                trips: dict[str, list[float]] = {kind: [] for kind in kinds}
                for _ in range(20):  # warm-up
                    for kind in kinds:
                        bench.roundtrip(started[kind][1])
                for n in range(args.trips):
                    order = kinds if n % 2 == 0 else kinds[::-1]
                    for kind in order:
                        trips[kind].append(bench.roundtrip(started[kind][1])["roundtrip_ms"])
            finally:
                for km, kc in started.values():
                    shutdown(km, kc)
    plain = statistics.median(trips["plain"])
    print(f"1+1 round trip (reply and idle), median of {args.trips} per kind, all kinds in turn:")
    print(f"{'kind':<26} {'median ms':>10} {'vs plain':>9} {'+us':>7}")
    for kind in kinds:
        median = statistics.median(trips[kind])
        print(f"{kind:<26} {median:>10.3f} {median / plain:>8.2f}x {(median - plain) * 1000:>7.0f}")
    print(f"(at {time.strftime('%Y-%m-%d %H:%M:%S')})")


if __name__ == "__main__":
    main()
