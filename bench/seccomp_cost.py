"""What the seccomp filters cost: start to ready, and ``1+1`` (reply and idle), with and without them.

The same ``ivralo`` kernelspec (its provisioner, the OS sandbox where bwrap works), started one at a
time, the kinds interleaved (with, without, then without, with, ...), so the machine's drift
cancels in each pair. **Without** means neither filter is installed: the host gives bwrap no
``--seccomp``, and a ``sitecustomize`` on ``PYTHONPATH`` (seen by the supervisor and the kernel)
makes ``protocol.seccomp.install`` do nothing. **With** runs a ``sitecustomize`` that imports the
same module and changes nothing, so both kinds pay the same imports. The session of its own
(``--new-session``, ``setsid``) is in both.

Per start: ms from ``start_kernel()`` to ``wait_for_ready()``; then ``--cells`` executions of
``1+1`` one after another, each until its reply and its idle, and their median.

Run: ``.venv/bin/python bench/seccomp_cost.py [--rounds N] [--cells M]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup_latency import isolate_jupyter

KINDS = ("with", "without")
SITE = {
    "with": "import ivralo_kernel.protocol.sandbox.seccomp\n",
    "without": "import ivralo_kernel.protocol.sandbox.seccomp as s\ns.install = lambda *args, **kwargs: None\n",
}


def roundtrip(kc: Any, code: str, timeout: float = 60) -> float:
    started = time.perf_counter()
    msg_id = kc.execute(code)
    replied = idle = False
    deadline = time.monotonic() + timeout
    while not (replied and idle):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"{code!r} got no reply and idle in {timeout} s")
        if not replied:
            with_reply = kc.get_shell_msg(timeout=remaining)
            replied = with_reply["parent_header"].get("msg_id") == msg_id
            continue
        msg = kc.get_iopub_msg(timeout=remaining)
        idle = msg["parent_header"].get("msg_id") == msg_id and msg["content"].get("execution_state") == "idle"
    return (time.perf_counter() - started) * 1000


def one(kind: str, workspace: Path, cells: int) -> dict[str, Any]:
    from jupyter_client.manager import KernelManager

    from ivralo_kernel.host.sandbox import launch as sandbox_launch

    original = sandbox_launch._seccomp_program_fd
    if kind == "without":
        sandbox_launch._seccomp_program_fd = lambda: -1  # type: ignore[assignment]
    env = dict(os.environ, PYTHONPATH=str(workspace / kind))
    km = KernelManager(kernel_name="ivralo")
    try:
        started = time.perf_counter()
        km.start_kernel(cwd=str(workspace), env=env)
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        ready_ms = (time.perf_counter() - started) * 1000
        layers = kc.kernel_info(reply=True, timeout=30)["content"]["ivralo"]["layers"]
        filtered = "installed by" in str(layers.get("seccomp")) and str(layers.get("unix_sockets")).startswith("closed")
        if filtered != (kind == "with"):
            raise RuntimeError(f"the {kind!r} kernel reports seccomp={layers.get('seccomp')!r}")
        roundtrip(kc, "1+1")  # the first cell pays for IPython's first compile
        times = [roundtrip(kc, "1+1") for _ in range(cells)]
        kc.stop_channels()
    finally:
        sandbox_launch._seccomp_program_fd = original  # type: ignore[assignment]
        km.shutdown_kernel(now=True)
    return {"kind": kind, "ready_ms": ready_ms, "one_plus_one_ms": statistics.median(times)}


# In a child of its own: the time to build and install both filters, and the cost per system call
# of one the filter lets through by its cache (getppid) and of one it judges by its arguments
# (ioctl, here FIONREAD on a pipe), with the filters against without them.
MICRO = r"""
import fcntl, os, struct, sys, time, termios
from ivralo_kernel.protocol.sandbox import seccomp
CALLS = 200_000
r, w = os.pipe()
def per_call(fn):
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter_ns()
        for _ in range(CALLS):
            fn()
        best = min(best, (time.perf_counter_ns() - t) / CALLS)
    return best
install_us = 0.0
if sys.argv[1] == "with":
    arch = seccomp.this_arch()
    t = time.perf_counter_ns()
    seccomp.install(seccomp.base_filter(arch), arch)
    seccomp.install(seccomp.unix_socket_filter(arch), arch, all_threads=True)
    install_us = (time.perf_counter_ns() - t) / 1000
buf = bytearray(4)
print(install_us, per_call(os.getppid), per_call(lambda: fcntl.ioctl(r, termios.FIONREAD, buf)))
"""


def micro(rounds: int) -> None:
    import subprocess

    results: dict[str, list[list[float]]] = {kind: [] for kind in KINDS}
    for round_ in range(rounds):
        for kind in KINDS if round_ % 2 == 0 else reversed(KINDS):
            done = subprocess.run([sys.executable, "-c", MICRO, kind], capture_output=True, text=True, check=True)
            results[kind].append([float(x) for x in done.stdout.split()])
    print(f"{'':<10}{'install both, us':>20}{'getppid, ns/call':>20}{'ioctl, ns/call':>20}")
    for kind in KINDS:
        columns = list(zip(*results[kind], strict=True))
        print(f"{kind:<10}" + "".join(f"{min(c):>20.2f}" for c in columns))  # the least disturbed run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="pairs of starts (default 10)")
    parser.add_argument("--cells", type=int, default=50, help="1+1 executions per start (default 50)")
    parser.add_argument("--micro-rounds", type=int, default=6, help="runs of the per-call measurement (default 6)")
    args = parser.parse_args()
    micro(args.micro_rounds)
    root = Path(tempfile.mkdtemp(prefix="ivralo-bench-seccomp-"))
    isolate_jupyter(root)
    workspace = root / "workspace"
    for kind in KINDS:
        (workspace / kind).mkdir(parents=True)
        (workspace / kind / "sitecustomize.py").write_text(SITE[kind])
    samples: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        for kind in KINDS if round_ % 2 == 0 else reversed(KINDS):
            samples.append(one(kind, workspace, args.cells))
            print(samples[-1], file=sys.stderr, flush=True)
    print(f"{'':<10}{'start to ready, ms (median)':>30}{'1+1 reply and idle, ms (median)':>34}")
    for kind in KINDS:
        mine = [s for s in samples if s["kind"] == kind]
        ready = statistics.median(s["ready_ms"] for s in mine)
        cell = statistics.median(s["one_plus_one_ms"] for s in mine)
        print(f"{kind:<10}{ready:>30.1f}{cell:>34.3f}")
    # Each round's two starts, "with" minus "without".
    pairs = [sorted(samples[i : i + 2], key=lambda s: s["kind"] != "with") for i in range(0, len(samples), 2)]
    for metric, unit in (("ready_ms", "start"), ("one_plus_one_ms", "1+1")):
        delta = [w[metric] - wo[metric] for w, wo in pairs]
        print(
            f"paired {unit} difference (with - without): median {statistics.median(delta):+.3f} ms, "
            f"range {min(delta):+.3f} .. {max(delta):+.3f} ms over {len(delta)} pairs"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
