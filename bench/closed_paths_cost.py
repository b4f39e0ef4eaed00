"""What the closed paths' two covers cost on a start (docs/security.md, "Closed paths").

1. **Closed links**: the ``ivralo`` kernelspec started in a folder whose ``.vscode`` and ``.envrc``
   are links, and in the same folder without them, interleaved (linked, plain, then plain, linked,
   ...), so the machine's drift cancels in each pair: the host's helper that mounts each link over
   itself runs between bwrap's build and the kernel's start.
2. **The home folder's top level**: a start with the workspace = ``$HOME`` holding 0, 10 and
   ``--entries`` top-level entries (one writable mount each over the read-only level).

Per start: seconds from ``start_kernel()`` to ``wait_for_ready()``. Prints one JSON line.

Run: ``.venv/bin/python bench/closed_paths_cost.py [--rounds N] [--entries M]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup_latency import isolate_jupyter


def start(workspace: Path) -> float:
    from jupyter_client.manager import KernelManager

    began = time.monotonic()
    manager = KernelManager(kernel_name="ivralo")
    manager.start_kernel(cwd=str(workspace))
    client = manager.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=120)
        return time.monotonic() - began
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--entries", type=int, default=300)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ivralo-bench-closed-"))
    isolate_jupyter(root / "jupyter")
    plain, linked = root / "plain", root / "linked"
    for folder in (plain, linked):
        (folder / "cfg").mkdir(parents=True)
    (linked / ".vscode").symlink_to("cfg")
    (linked / ".envrc").symlink_to("cfg")
    times: dict[str, list[float]] = {"plain": [], "linked": []}
    for i in range(args.rounds):
        order = [("plain", plain), ("linked", linked)]
        for kind, folder in order if i % 2 else reversed(order):
            times[kind].append(start(folder))
    pairs = [linked_s - plain_s for linked_s, plain_s in zip(times["linked"], times["plain"], strict=True)]
    out: dict[str, float] = {f"{kind} median s": round(statistics.median(v), 3) for kind, v in times.items()}
    out["links paired median s"] = round(statistics.median(pairs), 3)
    homes = {}
    for count in (0, 10, args.entries):
        home = root / f"home{count}"
        home.mkdir()
        for n in range(count):
            entry = home / f"entry{n}"
            entry.mkdir() if n % 2 else entry.touch()
        homes[count] = home
    home_times: dict[int, list[float]] = {count: [] for count in homes}
    for _ in range(args.rounds):
        for count, home in homes.items():
            os.environ["HOME"] = str(home)
            home_times[count].append(start(home))
    for count, values in home_times.items():
        out[f"home with {count} top-level entries median s"] = round(statistics.median(values), 3)
    out["load"] = float(os.getloadavg()[0])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
