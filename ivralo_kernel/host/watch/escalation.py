"""[host] The deadline of one execution, as a pure state machine with an injected clock.

No I/O, no sleeping: the watchdog feeds it the time and what it saw (idle, a confirmation over
control, whether the tree still computes), and it answers with the next action. Every transition is
recorded, so tests assert which path ran (interrupt kept the namespace, or the tree was killed) and
the 60 s default runs in virtual time::

    RUNNING --deadline--> INTERRUPTING --idle------------------> SETTLING --quiet--> INTERRUPTED
       |                      |--grace--> CONFIRMING --not busy--^      \\--computing past
       |                      |                   \\--busy/no answer--> KILLED    deadline+grace--> KILLED
       |--deadline, interrupt_before_kill off -----------------------> KILLED
       \\--idle before the deadline--> SETTLING --quiet (or the next execution's busy)--> FINISHED

SETTLING is the kernel's word ("idle", "not running") waiting for the tree's: everything the kernel
says can be forged by code running in it, so the execution counts as running until the process tree
stops computing. If it still computes past the deadline and grace, the tree is killed.

Time spent paused (a person answering a question for the cell) does not count, as long as the tree
is quiet: a cell that waits for a person does not compute. While paused, the tree is sampled too,
and time it spends computing counts against the deadline (a question can be forged to stop it).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Phase(enum.Enum):
    RUNNING = "running"
    INTERRUPTING = "interrupting"
    CONFIRMING = "confirming"
    SETTLING = "settling"  # the kernel says it ended; waiting for the tree to stop computing
    FINISHED = "finished"
    INTERRUPTED = "interrupted"
    KILLED = "killed"

    @property
    def final(self) -> bool:
        return self in (Phase.FINISHED, Phase.INTERRUPTED, Phase.KILLED)


class Action(enum.Enum):
    NONE = "none"
    INTERRUPT = "interrupt"  # send the deadline notice, then SIGINT
    CONFIRM = "confirm"  # ask over control whether the execution is still running
    KILL = "kill"  # end the whole process tree
    CHECK_QUIET = "check quiet"  # sample the tree's CPU: is it still computing?


@dataclass(frozen=True)
class DeadlinePolicy:
    deadline_ms: int
    interrupt_before_kill: bool = True
    interrupt_grace_ms: int = 2_000
    confirm_timeout_ms: int = 100  # the control answer must come within the 250 ms reply margin
    settle_check_ms: int = 50  # how often a settling execution's tree is sampled


@dataclass
class Escalation:
    policy: DeadlinePolicy
    started_at: float
    phase: Phase = Phase.RUNNING
    history: list[tuple[float, Phase]] = field(default_factory=list)
    _paused_since: float | None = None
    _paused_total: float = 0.0
    _phase_since: float = 0.0
    _interrupted: bool = False  # settling after an interrupt: it ends INTERRUPTED, not FINISHED
    _next_check: float = 0.0

    def __post_init__(self) -> None:
        self._phase_since = self.started_at
        self.history.append((self.started_at, self.phase))

    # -- time ------------------------------------------------------------------------------
    def elapsed(self, now: float) -> float:
        """Seconds this execution has run, not counting pauses."""
        paused = self._paused_total + (now - self._paused_since if self._paused_since is not None else 0.0)
        return now - self.started_at - paused

    @property
    def interrupted(self) -> bool:
        """The deadline interrupted it (it may still be settling)."""
        return self._interrupted or self.phase in (Phase.INTERRUPTING, Phase.CONFIRMING, Phase.INTERRUPTED)

    @property
    def paused(self) -> bool:
        return self._paused_since is not None

    def pause(self, now: float) -> None:
        if self._paused_since is None and self.phase is Phase.RUNNING:
            self._paused_since = now
            self._next_check = now + self.policy.settle_check_ms / 1000

    def resume(self, now: float) -> None:
        if self._paused_since is not None:
            self._paused_total += now - self._paused_since
            self._paused_since = None

    def next_wakeup(self, now: float) -> float | None:
        """When ``step`` has something to do next (absolute time), or None while paused or final."""
        if self.phase is Phase.RUNNING:
            if self._paused_since is not None:
                return self._next_check
            return now + max(0.0, self.policy.deadline_ms / 1000 - self.elapsed(now))
        if self.phase is Phase.INTERRUPTING:
            return self._phase_since + self.policy.interrupt_grace_ms / 1000
        if self.phase is Phase.CONFIRMING:
            return self._phase_since + self.policy.confirm_timeout_ms / 1000
        if self.phase is Phase.SETTLING:
            return self._next_check
        return None

    # -- transitions -----------------------------------------------------------------------
    def _enter(self, phase: Phase, now: float) -> None:
        self.phase = phase
        self._phase_since = now
        self.history.append((now, phase))

    def step(self, now: float) -> Action:
        """Advance on the clock alone."""
        if self.phase is Phase.RUNNING and self._paused_since is not None and now >= self._next_check:
            self._next_check = now + self.policy.settle_check_ms / 1000
            return Action.CHECK_QUIET
        if self.phase is Phase.RUNNING and self._paused_since is None:
            if self.elapsed(now) >= self.policy.deadline_ms / 1000:
                if self.policy.interrupt_before_kill:
                    self._enter(Phase.INTERRUPTING, now)
                    return Action.INTERRUPT
                self._enter(Phase.KILLED, now)
                return Action.KILL
        elif self.phase is Phase.INTERRUPTING:
            if now - self._phase_since >= self.policy.interrupt_grace_ms / 1000:
                self._enter(Phase.CONFIRMING, now)
                return Action.CONFIRM
        elif self.phase is Phase.CONFIRMING and now - self._phase_since >= self.policy.confirm_timeout_ms / 1000:
            # No answer over control: the kernel is wedged (native code holding the GIL).
            self._enter(Phase.KILLED, now)
            return Action.KILL
        elif self.phase is Phase.SETTLING and now >= self._next_check:
            self._next_check = now + self.policy.settle_check_ms / 1000
            return Action.CHECK_QUIET
        return Action.NONE

    def _settle(self, now: float, interrupted: bool) -> None:
        self.resume(now)
        self._interrupted = interrupted
        self._next_check = now + self.policy.settle_check_ms / 1000
        self._enter(Phase.SETTLING, now)

    def on_idle(self, now: float) -> None:
        """The kernel says the execution ended (IOPub idle for its msg_id)."""
        if self.phase is Phase.RUNNING:
            self._settle(now, interrupted=False)
        elif self.phase in (Phase.INTERRUPTING, Phase.CONFIRMING):
            self._settle(now, interrupted=True)

    def on_confirm(self, still_running: bool, now: float) -> Action:
        """The kernel answered over control whether this execution is still running."""
        if self.phase is not Phase.CONFIRMING:
            return Action.NONE
        if still_running:
            self._enter(Phase.KILLED, now)
            return Action.KILL
        self._settle(now, interrupted=True)  # it says it ended, its idle dropped on IOPub
        return Action.NONE

    def on_quiet_check(self, quiet: bool, now: float, span: float = 0.0) -> Action:
        """What a sample of the tree showed (``span``: seconds since the previous one). Settling: quiet
        ends it, still computing past the deadline and grace kills. Paused: computing time counts."""
        if self.phase is Phase.RUNNING and self._paused_since is not None:
            if not quiet:
                self._paused_since = min(now, self._paused_since + span)
                if self.elapsed(now) >= self.policy.deadline_ms / 1000:
                    self.resume(now)
                    return self.step(now)
            return Action.NONE
        if self.phase is not Phase.SETTLING:
            return Action.NONE
        if quiet:
            self._enter(Phase.INTERRUPTED if self._interrupted else Phase.FINISHED, now)
            return Action.NONE
        if self.elapsed(now) >= (self.policy.deadline_ms + self.policy.interrupt_grace_ms) / 1000:
            self._enter(Phase.KILLED, now)
            return Action.KILL
        return Action.NONE

    def on_next_execution(self, now: float) -> None:
        """Another execution began: the kernel took the next request, so this one is over. (A
        kernel can forge this too; see the README's limits.)"""
        if self.phase is Phase.SETTLING:
            self._enter(Phase.INTERRUPTED if self._interrupted else Phase.FINISHED, now)

    @property
    def path(self) -> list[Phase]:
        return [phase for _, phase in self.history]
