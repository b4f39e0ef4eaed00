"""The deadline state machine in virtual time: which path ran, never how long it took."""

from __future__ import annotations

import pytest

from ivralo_kernel.host.watch.escalation import Action, DeadlinePolicy, Escalation, Phase

pytestmark = pytest.mark.fast  # starts no process: the fast tier (make test-fast)

DEFAULT = DeadlinePolicy(deadline_ms=60_000)  # the agent default: 60 s


def test_finishing_before_the_deadline_does_nothing() -> None:
    e = Escalation(DEFAULT, started_at=100.0)
    assert e.step(159.99) is Action.NONE
    e.on_idle(159.99)
    assert e.step(160.0) is Action.NONE
    assert e.step(160.05) is Action.CHECK_QUIET  # the tree's word, 50 ms on
    assert e.on_quiet_check(True, 160.05) is Action.NONE
    assert e.path == [Phase.RUNNING, Phase.SETTLING, Phase.FINISHED]
    assert e.step(500.0) is Action.NONE


def test_sixty_second_default_interrupts_and_keeps_the_namespace() -> None:
    e = Escalation(DEFAULT, started_at=0.0)
    assert e.next_wakeup(0.0) == 60.0
    assert e.step(59.999) is Action.NONE
    assert e.step(60.0) is Action.INTERRUPT
    assert e.next_wakeup(60.0) == 62.0  # default grace 2 s
    e.on_idle(60.01)
    e.on_quiet_check(True, 60.06)
    assert e.path == [Phase.RUNNING, Phase.INTERRUPTING, Phase.SETTLING, Phase.INTERRUPTED]


def test_interrupt_ignored_then_confirmed_busy_kills() -> None:
    e = Escalation(DEFAULT, started_at=0.0)
    e.step(60.0)
    assert e.step(61.9) is Action.NONE
    assert e.step(62.0) is Action.CONFIRM
    assert e.on_confirm(still_running=True, now=62.01) is Action.KILL
    assert e.path[-1] is Phase.KILLED


def test_no_answer_over_control_kills_within_the_margin() -> None:
    e = Escalation(DEFAULT, started_at=0.0)
    e.step(60.0)
    e.step(62.0)
    assert e.next_wakeup(62.0) == 62.1
    assert e.step(62.1) is Action.KILL
    assert 62.1 <= 60.0 + 2.0 + 0.25, "answered within deadline + grace + 250 ms"


def test_dropped_idle_is_caught_by_the_confirmation() -> None:
    e = Escalation(DEFAULT, started_at=0.0)
    e.step(60.0)
    e.step(62.0)
    assert e.on_confirm(still_running=False, now=62.05) is Action.NONE
    assert e.on_quiet_check(True, 62.1) is Action.NONE
    assert e.path[-1] is Phase.INTERRUPTED


def test_without_interrupt_before_kill_the_deadline_kills() -> None:
    e = Escalation(DeadlinePolicy(deadline_ms=5_000, interrupt_before_kill=False), started_at=0.0)
    assert e.step(5.0) is Action.KILL
    assert e.path == [Phase.RUNNING, Phase.KILLED]


def test_paused_time_does_not_count() -> None:
    e = Escalation(DeadlinePolicy(deadline_ms=2_000), started_at=0.0)
    e.step(1.0)
    e.pause(1.0)  # a person is answering a question for 5 s, the tree quiet
    assert e.step(6.0) is Action.CHECK_QUIET
    assert e.on_quiet_check(True, 6.0, span=5.0) is Action.NONE
    e.resume(6.0)
    assert e.elapsed(6.0) == 1.0
    assert e.step(6.9) is Action.NONE
    assert e.step(7.0) is Action.INTERRUPT


def test_a_claimed_idle_with_a_computing_tree_is_killed_at_deadline_plus_grace() -> None:
    """The kernel said idle at 10 s (forged: code in the kernel can send it), and the tree kept
    computing: still running, so the deadline and grace apply as if nothing was said."""
    e = Escalation(DEFAULT, started_at=0.0)
    e.on_idle(10.0)
    now = 10.0
    while (wake := e.next_wakeup(now)) is not None and wake < 70.0:
        now = wake
        if e.step(now) is Action.CHECK_QUIET and e.on_quiet_check(False, now) is Action.KILL:
            break
    assert e.path == [Phase.RUNNING, Phase.SETTLING, Phase.KILLED]
    assert 62.0 <= now <= 62.0 + 0.05 + 1e-9, now  # deadline + grace, to one sample interval


def test_a_denied_execution_whose_tree_computes_is_killed() -> None:
    """Past the grace the kernel answers "not running" (it can lie), but the tree still computes."""
    e = Escalation(DEFAULT, started_at=0.0)
    e.step(60.0)
    e.step(62.0)
    assert e.on_confirm(still_running=False, now=62.05) is Action.NONE
    assert e.step(62.1) is Action.CHECK_QUIET
    assert e.on_quiet_check(False, 62.1) is Action.KILL
    assert e.path[-1] is Phase.KILLED


def test_the_next_execution_ends_a_settling_one() -> None:
    e = Escalation(DEFAULT, started_at=0.0)
    e.on_idle(1.0)
    e.on_next_execution(1.01)
    assert e.path == [Phase.RUNNING, Phase.SETTLING, Phase.FINISHED]


def test_a_pause_does_not_cover_computing() -> None:
    """A question for the person pauses the deadline; a tree that computes meanwhile (the question
    was forged, or the cell works on) is charged for it, and the deadline still comes."""
    e = Escalation(DeadlinePolicy(deadline_ms=2_000), started_at=0.0)
    e.pause(1.0)
    now, action = 1.0, Action.NONE
    while action is not Action.INTERRUPT and now < 10.0:
        now = e.next_wakeup(now) or now + 0.05
        if e.step(now) is Action.CHECK_QUIET:
            action = e.on_quiet_check(False, now, span=0.05)
    assert action is Action.INTERRUPT
    assert abs(now - 2.0) <= 0.06, now  # charged as if never paused


def test_a_quiet_pause_does_not_count() -> None:
    e = Escalation(DeadlinePolicy(deadline_ms=2_000), started_at=0.0)
    e.pause(1.0)
    now = 1.0
    while now < 30.0:
        now = e.next_wakeup(now) or now + 0.05
        if e.step(now) is Action.CHECK_QUIET:
            assert e.on_quiet_check(True, now, span=0.05) is Action.NONE
    e.resume(now)
    assert abs(e.elapsed(now) - 1.0) < 1e-6
