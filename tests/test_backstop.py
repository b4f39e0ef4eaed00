"""The supervisor's deadline backstop: where a host enforces deadlines, nothing the kernel writes on
its pipe can postpone or cancel a kill time; only the host's own pipe can."""

from __future__ import annotations

import pytest

from ivralo_kernel.protocol import pipe
from ivralo_kernel.supervisor.backstop import Backstop

pytestmark = pytest.mark.fast  # starts no process: the fast tier (make test-fast)


def kill_at(value: str) -> pipe.KillAt:
    """A kill-at line as it crosses the pipe (encoded, then decoded by the supervisor)."""
    line = pipe.decode(f"kill-at:{value}")
    assert isinstance(line, pipe.KillAt)
    assert pipe.decode(pipe.encode(line).decode().rstrip("\n")) == line
    return line


def test_under_a_host_the_kernel_may_only_arm_or_bring_closer() -> None:
    b = Backstop(kernel_may_disarm=False)
    b.apply(kill_at("exec-1:100.0"), from_host=False)  # the kernel, from the cell's first line
    assert b.kill_at == 100.0
    b.apply(kill_at("exec-1:off"), from_host=False)  # forged by code in the kernel
    b.apply(kill_at("exec-1:1e12"), from_host=False)
    assert b.kill_at == 100.0
    b.apply(kill_at("exec-1:90.0"), from_host=False)
    assert b.kill_at == 90.0
    b.apply(kill_at("exec-1:102.0"), from_host=True)  # the host's own time for it replaces the kernel's
    assert b.kill_at == 102.0
    b.apply(kill_at("exec-1:off"), from_host=True)  # the host saw it end and the tree settle
    assert b.kill_at is None


def test_without_a_host_the_in_kernel_watchdog_is_the_authority() -> None:
    b = Backstop(kernel_may_disarm=True)
    b.apply(kill_at("exec-1:100.0"), from_host=False)
    b.apply(kill_at("exec-1:off"), from_host=False)
    assert b.kill_at is None


def test_garbage_is_no_line_at_all() -> None:
    for text in ("kill-at:exec-1:nan", "kill-at:exec-1:inf", "kill-at:exec-1:soon", "kill-at:", "kill-nowish", ""):
        assert pipe.decode(text) is None, text
    assert pipe.decode("stage:guards installed") == pipe.Stage("guards installed")
    assert pipe.decode("kill-now") == pipe.KillNow()


def test_a_stopped_watchdog_writes_no_kill_time() -> None:
    """The host's pipe serves every kernel of a launch. A stopped watchdog (its kernel crashed and is
    being restarted) that still armed its crashed cell's kill time put it in the next supervisor's
    pipe after that supervisor had emptied it, and the next kernel's cell was killed at that time."""
    import os

    from ivralo_kernel.host.watch.escalation import DeadlinePolicy
    from ivralo_kernel.host.watch.watchdog import Watchdog, WatchdogSettings

    written: list[tuple[str, float | None]] = []
    settings = WatchdogSettings(deadline=DeadlinePolicy(deadline_ms=3000, interrupt_grace_ms=1000))
    info = {"transport": "tcp", "ip": "127.0.0.1", "key": "", "signature_scheme": "hmac-sha256"}
    dog = Watchdog(info, os.getpid(), settings, lambda: None, backstop=lambda e, at: written.append((e, at)))
    assert dog.deadlines is not None
    dog.deadlines.on_busy("crashed-cell", real=True)
    assert [e for e, _ in written] == ["crashed-cell"]  # armed while it watches
    dog.stop()
    dog.deadlines.on_busy("after-stop", real=True)
    dog.deadlines.resume("crashed-cell")
    assert [e for e, _ in written] == ["crashed-cell"], written


def test_the_host_writes_a_kill_time_only_when_it_moves() -> None:
    """Each line on the host's pipe wakes the supervisor's process, on a reply's way: the watch arms
    at every step it takes, but the supervisor hears a running cell's kill time once, then again only
    when it moves (a pause takes it away, the resume gives a later one), and the cancel once."""
    import logging
    import os
    import time

    from ivralo_kernel.host.watch.deadline import DeadlineWatch
    from ivralo_kernel.host.watch.escalation import DeadlinePolicy

    written: list[tuple[str, float | None]] = []
    watch = DeadlineWatch(
        DeadlinePolicy(deadline_ms=60_000, interrupt_grace_ms=1000),
        os.getpid(),
        time.monotonic,
        kill=lambda _msg_id, _cause: None,
        signal_interrupt=lambda: None,
        backstop=lambda e, at: written.append((e, at)),
        log=logging.getLogger(__name__),
    )
    watch.on_busy("cell", real=True)
    for _ in range(5):  # nothing is due: each step arms the same kill time again
        watch.advance(time.monotonic(), channels=None, on_control=lambda _msg: None)  # type: ignore[arg-type]
    assert len(written) == 1 and written[0][0] == "cell" and written[0][1] is not None, written
    watch.pause("cell")
    assert written[-1] == ("cell", None), written
    watch.resume("cell")
    assert len(written) == 3 and written[-1][1] is not None, written
    watch.on_idle("cell")
    watch.advance(time.monotonic(), channels=None, on_control=lambda _msg: None)  # type: ignore[arg-type]
    watch.advance(time.monotonic(), channels=None, on_control=lambda _msg: None)  # type: ignore[arg-type]
    assert written.count(("cell", None)) <= 2, written
