"""Nothing lost (issue 30, Must 5): a kernel killed in the middle of a cell's overwrite leaves the file
untouched or its previous version in the history the host lists; the indexes stay readable.

The kills land at random points: 200 times a forked copy of the kernel (the same process image, the
same write guard) overwrites its own file and is SIGKILLed after a random delay drawn across the
whole overwrite, from the copy the guard takes to the last byte of the new content; then the kernel
itself, killed by its deadline and by SIGKILL, or out of memory, in the middle of an overwrite. Judged from outside:
the bytes on disk, and the history as the host lists it (``Session.history``, the host's ledger)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest

from ivralo_kernel.host import Session, WorkerConfig

ITERATIONS = 200
SIZE = 256 << 10  # big enough that the copy and the overwrite each take a while

# In the kernel: each file's old content is its name's byte repeated; the forked copy writes the
# new content in pieces, so a kill can land inside the copy, the index line or the overwrite.
FORKED_KILLS = r"""
import os, random, signal, time
size, n = {size}, {n}
def overwrite(path):
    with open(path, "wb") as f:
        for _ in range(16):
            f.write(b"N" * (size // 16))
def child(path):
    pid = os.fork()
    if pid == 0:
        try:
            overwrite(path)
        finally:
            os._exit(0)
    return pid
for i in range(3):  # the length of an unkilled overwrite: the range the kill points are drawn from
    open(f"probe{{i}}", "wb").write(b"o" * size)
    start = time.perf_counter(); os.waitpid(child(f"probe{{i}}"), 0); took = time.perf_counter() - start
rng = random.Random(30)
for i in range(n):
    path = f"f{{i:03d}}.bin"
    open(path, "wb").write(bytes([i % 251]) * size)
for i in range(n):
    pid = child(f"f{{i:03d}}.bin")
    time.sleep(rng.uniform(0, took * 1.2))
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
print("done", round(took * 1000, 2))
"""


def listed_copies(ws: Path, history: list[dict[str, object]]) -> dict[str, set[bytes]]:
    """Each file's kept contents, as the host lists them."""
    kept: dict[str, set[bytes]] = {}
    for entry in history:
        copy = ws / str(entry["copy"])
        kept.setdefault(os.path.basename(str(entry["path"])), set()).add(copy.read_bytes())
    return kept


def index_lines_parse(ws: Path) -> None:
    """Every line of the kernel's index is whole JSON: no torn line took the next one with it."""
    for line in (ws / ".ivralo" / "history" / "index.jsonl").read_text().splitlines():
        json.loads(line)


@pytest.mark.timeout(180)
async def test_forked_kills_at_random_points_lose_nothing(workspace: Path) -> None:
    async with Session(workspace=workspace) as session:
        result = await session.run(FORKED_KILLS.format(size=SIZE, n=ITERATIONS))
        assert isinstance(result, str) and result.startswith("done"), result
        history = await session.history()
    kept = listed_copies(workspace, history)
    changed = 0
    for i in range(ITERATIONS):
        name, old = f"f{i:03d}.bin", bytes([i % 251]) * SIZE
        now = (workspace / name).read_bytes()
        if now != old:
            changed += 1
            assert old in kept.get(name, set()), f"{name}: changed ({len(now)} bytes) and its old version not listed"
    print(f"{changed} of {ITERATIONS} kills landed after the overwrite began")
    assert changed > ITERATIONS // 4, f"only {changed} kills landed after the overwrite began"
    index_lines_parse(workspace)


OVERWRITE_THEN_TOO_MUCH = """
with open("big.bin", "wb") as f:
    f.write(b"N" * 4096); f.flush()
    more = bytearray(4 << 30)
"""
SLOW_OVERWRITE = """
import time
with open("big.bin", "wb") as f:
    while True:
        f.write(b"N" * 4096); f.flush(); time.sleep(0.001)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kill", ["deadline", "memory", "sigkill"])
async def test_a_killed_kernel_leaves_the_previous_version(workspace: Path, kill: str) -> None:
    old = b"the person's data\n" * 4096
    (workspace / "big.bin").write_bytes(old)
    config = {
        "deadline": WorkerConfig(deadline_ms=1500, interrupt_grace_ms=1),
        "memory": WorkerConfig(memory_limit_bytes=1 << 30),
        "sigkill": WorkerConfig(),
    }[kill]
    async with Session(workspace=workspace, config=config) as session:
        if kill == "sigkill":
            assert await session.run("1") == "1\n"
            pid = session.pid  # the kernel process, as this machine sees it
            assert pid is not None
            task = asyncio.ensure_future(session.run(SLOW_OVERWRITE))
            while (workspace / "big.bin").stat().st_size == len(old) and not task.done():
                await asyncio.sleep(0.01)  # the overwrite has begun (a state polled, not a time waited)
            os.kill(pid, signal.SIGKILL)
            result = await task
        else:
            result = await session.run(SLOW_OVERWRITE if kill == "deadline" else OVERWRITE_THEN_TOO_MUCH)
        assert isinstance(result, dict), result
        history = await session.history()
    assert (workspace / "big.bin").read_bytes() != old
    assert old in listed_copies(workspace, history).get("big.bin", set()), history


# A host recording copies in the ledger, SIGKILLed at random points of its appends: each child
# appends batches and says on a pipe which batch it finished; the parent kills it after a random
# delay. Run in a process of its own (forking pytest, with its threads, would not be safe).
HOST_CRASHES = r"""
import os, random, signal, sys, time
from ivralo_kernel.host.history.ledger import HistoryLedger, Recorded
from ivralo_kernel.protocol.history_index import new_entry
workspace, n = sys.argv[1], int(sys.argv[2])
ledger = HistoryLedger(workspace)
rng = random.Random(30)
done = []
for i in range(n):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        for batch in range(1000):
            records = [Recorded(new_entry(f"{workspace}/k{i}-{batch}-{j}", "open for writing", 1), "0" * 64)
                       for j in range(200)]
            ledger.add(records)
            os.write(w, f"{batch}\n".encode())
        os._exit(0)
    os.close(w)
    time.sleep(rng.uniform(0, 0.02))
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    with os.fdopen(r) as said:
        finished = [int(line) for line in said.read().split()]
    done.append((i, max(finished, default=-1)))
print(" ".join(f"{i}:{last}" for i, last in done))
"""


@pytest.mark.timeout(180)
def test_the_ledger_survives_a_host_killed_in_the_middle_of_its_appends(workspace: Path) -> None:
    import subprocess
    import sys

    from ivralo_kernel.host.history.ledger import HistoryLedger

    said = subprocess.run(
        [sys.executable, "-c", HOST_CRASHES, str(workspace), str(ITERATIONS)],
        capture_output=True, text=True, timeout=150, check=True,
    )  # fmt: skip
    recorded = {os.path.basename(r.entry.path) for r in HistoryLedger(str(workspace)).recorded().values()}
    lost = []
    for pair in said.stdout.split():
        i, last = map(int, pair.split(":"))
        lost += [f"k{i}-{batch}" for batch in range(last + 1) if f"k{i}-{batch}-199" not in recorded]
    assert not lost, f"finished batches missing after the kills: {lost[:5]} ({len(lost)})"
    assert len(recorded) >= 200 * sum(1 for p in said.stdout.split() if not p.endswith(":-1"))


@pytest.mark.fast
def test_a_torn_last_line_costs_only_itself(workspace: Path) -> None:
    """What a write cut short leaves (a full disk, a crash inside one large write): the next record
    starts on a line of its own, so it is kept."""
    from ivralo_kernel.host.history.ledger import HistoryLedger, Recorded
    from ivralo_kernel.protocol.history_index import new_entry

    ledger = HistoryLedger(str(workspace))
    ledger.add([Recorded(new_entry(f"{workspace}/before", "open for writing", 1), "0" * 64)])
    with open(ledger.path, "ab") as torn:
        torn.write(b'{"time": "2026-12-02T10:00:00+0000", "ns": 1, "pa')
    ledger.add([Recorded(new_entry(f"{workspace}/after", "open for writing", 1), "0" * 64)])
    kept = {os.path.basename(r.entry.path) for r in ledger.recorded().values()}
    assert kept == {"before", "after"}


@pytest.mark.fast
def test_a_torn_index_line_costs_only_itself(workspace: Path) -> None:
    """The write guard's index, the same: a torn last line does not take the next copy's line with it."""
    from ivralo_kernel.guards.history import History
    from ivralo_kernel.protocol.history_index import parse_line

    folder = workspace / ".ivralo" / "history"
    history = History(str(folder))
    (workspace / "a.txt").write_text("a")
    history.save(str(workspace / "a.txt"), "open for writing")
    with open(folder / "index.jsonl", "a") as torn:
        torn.write('{"time": "2026-12-02T10:00:00+0000", "ns": 1, "pa')
    (workspace / "b.txt").write_text("b")
    history.save(str(workspace / "b.txt"), "open for writing")
    lines = (folder / "index.jsonl").read_text().splitlines()
    kept = [e.path for e in map(parse_line, lines) if e is not None]
    assert kept == [str(workspace / "a.txt"), str(workspace / "b.txt")]
