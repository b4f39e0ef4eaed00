"""One outcome per execution (host/watch/outcome.py): the client's reply and the watchdog's loss race, and
exactly one decides, once. Driven with real threads and, for the race with the deadline, a real
kernel, its provisioner's watchdog and its real deadline kill, judged from the process table."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import gone, wait_until_async

from ivralo_kernel.host import WorkerConfig
from ivralo_kernel.host.agent.worker import Worker, WorkerSettings
from ivralo_kernel.host.watch.outcome import Lost, Outcome, Outcomes, Replied

DEADLINE_MS = 600


def _race_in_threads(msg_id: str) -> None:
    outcome = Outcome(msg_id)
    resolutions: list[Any] = []
    outcome.future.add_done_callback(resolutions.append)
    start = threading.Barrier(2)
    won: dict[str, bool] = {}

    def reply() -> None:
        start.wait()
        won["reply"] = outcome.reply({"content": {"status": "ok"}})

    def lose() -> None:
        start.wait()
        won["loss"] = outcome.lose("killed")

    threads = [threading.Thread(target=reply), threading.Thread(target=lose)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(resolutions) == 1, "the future was resolved exactly once"
    assert sorted(won.values()) == [False, True], "one side decided; the other was dropped"
    ended = outcome.future.result()
    assert isinstance(ended, Replied if won["reply"] else Lost)
    assert not outcome.reply(None) and not outcome.lose("later") and outcome.future.result() is ended


def test_a_reply_and_a_loss_from_two_threads_decide_once() -> None:
    for round_ in range(200):
        _race_in_threads(f"m{round_}")


def test_a_held_reply_waits_for_the_tree_and_a_loss_meanwhile_decides() -> None:
    held = {"m": True}
    outcomes = Outcomes(held=lambda msg_id: held[msg_id])
    outcome = outcomes.of("m")
    assert not outcome.reply({"content": {"status": "error"}}), "interrupted and not settled: held"
    assert not outcome.done
    outcomes.lose_all("timeout: the tree was killed while it settled")
    assert isinstance(outcome.future.result(), Lost)
    assert not outcome.settle(), "the held reply does not decide after the loss"
    assert isinstance(outcomes.of("later").future.result(), Lost), "once the tree is gone, later ones are lost too"


async def _one_race(workspace: Path, sleep_s: float) -> tuple[Any, bool, int]:
    """A cell that sleeps about as long as its deadline (which kills, no interrupt): who decides?"""
    config = WorkerConfig(deadline_ms=DEADLINE_MS, interrupt_before_kill=False, observer_poll_ms=100)
    worker = await Worker.start(WorkerSettings(str(workspace), config))
    try:
        pid = worker.pid
        assert pid is not None
        msg_id = worker.kc.execute(f"import time; time.sleep({sleep_s})", user_expressions={})
        outcome = worker.outcome(msg_id)
        resolutions: list[Any] = []
        outcome.future.add_done_callback(resolutions.append)

        async def read_reply() -> bool:
            while True:
                msg = await worker.kc.get_shell_msg(timeout=None)
                if msg["parent_header"].get("msg_id") == msg_id:
                    return outcome.reply(msg)

        reading = asyncio.create_task(read_reply())
        ended = await asyncio.wait_for(outcome.wait(), 30)
        reply_decided = False
        if isinstance(ended, Replied):
            reply_decided = await asyncio.wait_for(reading, 5)
        reading.cancel()
        # Whatever else happens now (the kill after a reply, a reply after the kill), nothing changes.
        await asyncio.sleep(0)
        assert not outcome.lose("late") and not outcome.reply(None)
        assert len(resolutions) == 1 and outcome.future.result() is ended
        return ended, reply_decided, pid
    finally:
        await worker.stop()


@pytest.mark.timeout(180)
async def test_the_deadline_and_the_reply_race_and_one_outcome_decides(workspace: Path) -> None:
    seen: set[type] = set()
    for sleep_s in (0.1, DEADLINE_MS / 1000, DEADLINE_MS / 1000 + 0.02, 3.0):
        ended, reply_decided, pid = await _one_race(workspace, sleep_s)
        seen.add(type(ended))
        if isinstance(ended, Replied):
            assert reply_decided and ended.reply is not None
            assert ended.reply["content"]["status"] == "ok", "a reply that decided is the kernel's own"
        else:
            # A loss decided: judged from outside, the kernel's tree is gone.
            await wait_until_async(functools.partial(gone, pid), 10, f"the killed kernel pid {pid} to be gone")
        if sleep_s == 0.1:
            assert isinstance(ended, Replied), "well inside its deadline, the reply decides"
        if sleep_s == 3.0:
            assert isinstance(ended, Lost), "far past its deadline, the kill decides"
    assert seen == {Replied, Lost}


@pytest.mark.timeout(120)
async def test_a_crash_decides_when_it_happens_not_at_the_next_sample(workspace: Path) -> None:
    """The tree's exit wakes the watchdog (a pidfd), which loses the open outcome: with the tree
    sampled once a minute, a cell that kills its kernel still returns within seconds, and nothing
    else polls the kernel meanwhile (Session's 20 ms poll of is_alive is gone)."""
    from ivralo_kernel.host import Session

    async with Session(workspace=workspace, config=WorkerConfig(observer_poll_ms=60_000)) as session:
        assert await session.run("alpha = 1") == ""
        pid = session.pid
        assert pid is not None
        started = time.monotonic()
        result = await asyncio.wait_for(session.run("import os; os._exit(9)"), 60)
        took = time.monotonic() - started
        assert isinstance(result, dict) and "crash: the kernel exited with status 9" in result["error"]
        assert "alpha" in result["error"], "the lost names are listed"
        assert gone(pid), "judged from the process table: the kernel is gone"
        assert took < 20, f"the crash was seen after {took:.1f} s: the next sample, not the exit"
