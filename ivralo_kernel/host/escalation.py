"""[host] The deadline of one execution, as a pure state machine with an injected clock.

No I/O, no sleeping: the watchdog feeds it the time and what it saw (idle, a confirmation over
control), and it answers with the next action. Every transition is recorded, so tests assert which
path ran (interrupt kept the namespace, or the tree was killed) and the 60 s default runs in
virtual time::

    RUNNING --deadline--> INTERRUPTING --idle--------------------------> INTERRUPTED (namespace kept)
       |                      |--grace--> CONFIRMING --not busy--------> INTERRUPTED (idle was lost)
       |                      |                   \\--busy/no answer--> KILLED
       |--deadline, interrupt_before_kill off -----------------------> KILLED
       \\--idle before the deadline----------------------------------> FINISHED

Time spent paused (a person answering a question for the cell) does not count.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Phase(enum.Enum):
    RUNNING = "running"
    INTERRUPTING = "interrupting"
    CONFIRMING = "confirming"
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


@dataclass(frozen=True)
class DeadlinePolicy:
    deadline_ms: int
    interrupt_before_kill: bool = True
    interrupt_grace_ms: int = 2_000
    confirm_timeout_ms: int = 100  # the control answer must come within the 250 ms reply margin


@dataclass
class Escalation:
    policy: DeadlinePolicy
    started_at: float
    phase: Phase = Phase.RUNNING
    history: list[tuple[float, Phase]] = field(default_factory=list)
    _paused_since: float | None = None
    _paused_total: float = 0.0
    _phase_since: float = 0.0

    def __post_init__(self) -> None:
        self._phase_since = self.started_at
        self.history.append((self.started_at, self.phase))

    # -- time ------------------------------------------------------------------------------
    def elapsed(self, now: float) -> float:
        """Seconds this execution has run, not counting pauses."""
        paused = self._paused_total + (now - self._paused_since if self._paused_since is not None else 0.0)
        return now - self.started_at - paused

    def pause(self, now: float) -> None:
        if self._paused_since is None and self.phase is Phase.RUNNING:
            self._paused_since = now

    def resume(self, now: float) -> None:
        if self._paused_since is not None:
            self._paused_total += now - self._paused_since
            self._paused_since = None

    def next_wakeup(self, now: float) -> float | None:
        """When ``step`` has something to do next (absolute time), or None while paused or final."""
        if self.phase is Phase.RUNNING:
            if self._paused_since is not None:
                return None
            return now + max(0.0, self.policy.deadline_ms / 1000 - self.elapsed(now))
        if self.phase is Phase.INTERRUPTING:
            return self._phase_since + self.policy.interrupt_grace_ms / 1000
        if self.phase is Phase.CONFIRMING:
            return self._phase_since + self.policy.confirm_timeout_ms / 1000
        return None

    # -- transitions -----------------------------------------------------------------------
    def _enter(self, phase: Phase, now: float) -> None:
        self.phase = phase
        self._phase_since = now
        self.history.append((now, phase))

    def step(self, now: float) -> Action:
        """Advance on the clock alone."""
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
        return Action.NONE

    def on_idle(self, now: float) -> None:
        """The execution ended (IOPub idle for its msg_id)."""
        if self.phase is Phase.RUNNING:
            self._enter(Phase.FINISHED, now)
        elif self.phase in (Phase.INTERRUPTING, Phase.CONFIRMING):
            self._enter(Phase.INTERRUPTED, now)

    def on_confirm(self, still_running: bool, now: float) -> Action:
        """The kernel answered over control whether this execution is still running."""
        if self.phase is not Phase.CONFIRMING:
            return Action.NONE
        if still_running:
            self._enter(Phase.KILLED, now)
            return Action.KILL
        self._enter(Phase.INTERRUPTED, now)  # it ended; its idle was dropped on IOPub
        return Action.NONE

    @property
    def path(self) -> list[Phase]:
        return [phase for _, phase in self.history]
