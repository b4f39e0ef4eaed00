"""The deadline state machine in virtual time: which path ran, never how long it took."""

from __future__ import annotations

from ivralo_kernel.host.escalation import Action, DeadlinePolicy, Escalation, Phase

DEFAULT = DeadlinePolicy(deadline_ms=60_000)  # the agent default: 60 s


def test_finishing_before_the_deadline_does_nothing() -> None:
    e = Escalation(DEFAULT, started_at=100.0)
    assert e.step(159.99) is Action.NONE
    e.on_idle(159.99)
    assert e.path == [Phase.RUNNING, Phase.FINISHED]
    assert e.step(500.0) is Action.NONE


def test_sixty_second_default_interrupts_and_keeps_the_namespace() -> None:
    e = Escalation(DEFAULT, started_at=0.0)
    assert e.next_wakeup(0.0) == 60.0
    assert e.step(59.999) is Action.NONE
    assert e.step(60.0) is Action.INTERRUPT
    assert e.next_wakeup(60.0) == 62.0  # default grace 2 s
    e.on_idle(60.01)
    assert e.path == [Phase.RUNNING, Phase.INTERRUPTING, Phase.INTERRUPTED]


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
    assert e.path[-1] is Phase.INTERRUPTED


def test_without_interrupt_before_kill_the_deadline_kills() -> None:
    e = Escalation(DeadlinePolicy(deadline_ms=5_000, interrupt_before_kill=False), started_at=0.0)
    assert e.step(5.0) is Action.KILL
    assert e.path == [Phase.RUNNING, Phase.KILLED]


def test_paused_time_does_not_count() -> None:
    e = Escalation(DeadlinePolicy(deadline_ms=2_000), started_at=0.0)
    e.step(1.0)
    e.pause(1.0)  # a person is answering a question for 5 s
    assert e.next_wakeup(3.0) is None and e.step(6.0) is Action.NONE
    e.resume(6.0)
    assert e.elapsed(6.0) == 1.0
    assert e.step(6.9) is Action.NONE
    assert e.step(7.0) is Action.INTERRUPT
