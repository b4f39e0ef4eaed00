"""[host] The watchdog's deadline handler: one ``Escalation`` per execution (interrupt, confirm,
settle, kill; see escalation.py), the supervisor's backstop kept in step with it, and the kernel's
"stop this execution" asked over control before any signal."""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from ivralo_kernel.host.watch.escalation import Action, DeadlinePolicy, Escalation, Phase
from ivralo_kernel.host.watch.kernel_channels import KernelChannels
from ivralo_kernel.host.watch.observer import SHARED_SCAN_MAX_AGE_S, tree_cpu_s
from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.messages import DeadlineNotice
from ivralo_kernel.protocol.terminal import terminal_safe

CONTROL_ANSWER_S = 0.1  # how long the kernel has to act on a deadline notice itself
REPLY_MARGIN_S = 0.05  # how much longer its answer may take to reach us
KEEP_OUTCOMES = 64
# A settling execution's tree is quiet when it used at most this share of one core since the last
# sample (ipykernel's own bookkeeping after a cell is a few milliseconds).
QUIET_CPU_SHARE = 0.25
# Between the end of the grace and the supervisor's kill, as the kernel's own backstop has it
# (kernel/deadline.py BACKSTOP_SLACK_S: the host acts first, the supervisor catches what it missed).
BACKSTOP_SLACK_S = 0.12
# A kill time already armed is written again only when it moved by more than this: the watchdog
# arms at every step it takes (each message the kernel sends), and each line wakes the supervisor's
# process, on a reply's way. Well inside the slack above.
REARM_AFTER_S = 0.005

Backstop = Callable[[str, float | None], None]  # (execution, CLOCK_MONOTONIC kill time or None)
Kill = Callable[[str, str], None]  # (execution, cause)


class DeadlineWatch:
    def __init__(
        self,
        policy: DeadlinePolicy,
        root_pid: int,
        clock: Callable[[], float],
        kill: Kill,
        signal_interrupt: Callable[[], None],
        backstop: Backstop | None,
        log: logging.Logger | logging.LoggerAdapter[Any],
        replied: Callable[[str], bool] | None = None,
    ) -> None:
        self.policy = policy
        self.escalations: OrderedDict[str, Escalation] = OrderedDict()
        # The ones not final yet, which alone have wakeups and steps: each turn of the watchdog looks
        # at these (a few), not at the KEEP_OUTCOMES kept for their outcome.
        self._open: dict[str, Escalation] = {}
        self._root_pid, self._clock, self._kill, self._log = root_pid, clock, kill, log
        self._signal_interrupt = signal_interrupt
        # The supervisor's backstop, armed and disarmed by us alone.
        self._backstop = backstop
        # Did the kernel's execute_reply reach the clients (seen by the relay)? A settling execution
        # is over only then: "idle" and "not executing" are the kernel's word, which a cell can forge
        # while it sleeps on past its deadline. None: no relay, the kernel's word and the tree's CPU.
        self._replied = replied
        self._armed: dict[str, float] = {}  # execution -> the kill time the supervisor has
        # A settling execution's last reading of its tree: (when, CPU seconds so far).
        self._settle_from: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()  # pause/resume come from brokered calls' threads

    @property
    def cause(self) -> str:
        return f"timeout: execution exceeded deadline_ms={self.policy.deadline_ms}"

    # -- what the kernel said (the watchdog's thread) ----------------------------------------
    def on_busy(self, msg_id: str, real: bool) -> None:
        """``real``: a client sent this request (a "busy" that code in the kernel published for a
        request nobody sent does not end the earlier execution, nor start a fresh deadline's count
        for it)."""
        now = self._clock()
        with self._lock:
            for earlier, escalation in self._still_open():
                if real and earlier != msg_id and escalation.phase is Phase.SETTLING:
                    escalation.on_next_execution(now)
                    self._arm(earlier)
            if msg_id not in self.escalations:
                self._begin(msg_id, now)

    def on_turn(self, msg_id: str, at: float) -> None:
        """A client's request whose turn has come (the relay saw every earlier one answered): its
        deadline counts from then, whether or not the kernel ever says "busy" for it. A cell that
        forged its own reply and went on running is still the one that holds the kernel."""
        with self._lock:
            if msg_id not in self.escalations:
                self._begin(msg_id, at)

    def _begin(self, msg_id: str, at: float) -> None:
        """(under the lock) A new execution's escalation, counting from ``at``."""
        self.escalations[msg_id] = self._open[msg_id] = Escalation(self.policy, started_at=at)
        self._arm(msg_id)
        while len(self.escalations) > KEEP_OUTCOMES:
            gone, _ = self.escalations.popitem(last=False)
            self._open.pop(gone, None)

    def _still_open(self) -> list[tuple[str, Escalation]]:
        """(under the lock) The escalations not final yet; the final ones leave ``_open`` here."""
        for msg_id in [m for m, e in self._open.items() if e.phase.final]:
            del self._open[msg_id]
        return list(self._open.items())

    def on_idle(self, msg_id: str) -> None:
        with self._lock:
            escalation = self.escalations.get(msg_id)
            if escalation is None:
                return
            escalation.on_idle(self._clock())
            settling = escalation.phase is Phase.SETTLING
        if settling:
            self._take_reference(msg_id)  # the kernel's word; the tree's comes from samples from here on

    # -- any thread --------------------------------------------------------------------------
    def phase_of(self, msg_id: str) -> Phase | None:
        with self._lock:
            escalation = self.escalations.get(msg_id)
            return escalation.phase if escalation else None

    def settled(self, msg_id: str) -> bool:
        with self._lock:
            escalation = self.escalations.get(msg_id)
            return escalation is None or escalation.phase.final

    def interrupted(self, msg_id: str) -> bool:
        with self._lock:
            escalation = self.escalations.get(msg_id)
            return escalation is not None and escalation.interrupted

    def pause(self, msg_id: str) -> None:
        with self._lock:
            if msg_id in self.escalations:
                self.escalations[msg_id].pause(self._clock())
                self._settle_from.pop(msg_id, None)  # the first check takes the reference sample
                self._arm(msg_id)

    def resume(self, msg_id: str) -> None:
        with self._lock:
            if msg_id in self.escalations:
                self.escalations[msg_id].resume(self._clock())
                self._arm(msg_id)

    def wakeups(self, now: float) -> list[float]:
        with self._lock:
            return [w for _, e in self._still_open() if (w := e.next_wakeup(now)) is not None]

    # -- stepping (the watchdog's thread) -----------------------------------------------------
    def advance(self, now: float, channels: KernelChannels, on_control: Callable[[dict[str, Any]], None]) -> None:
        with self._lock:
            actions = [(msg_id, e.step(now)) for msg_id, e in self._still_open()]
        for msg_id, action in actions:
            if action is Action.CHECK_QUIET:
                action = self._check_quiet(msg_id, now)
            if action is Action.INTERRUPT:
                self._interrupt(msg_id, channels, on_control)
            elif action is Action.CONFIRM:
                channels.send(names.MSG_STATUS_REQUEST, {}, functools.partial(self._on_confirm, msg_id))
            elif action is Action.KILL:
                self._kill(msg_id, self.cause)
            with self._lock:
                self._arm(msg_id)

    def _on_confirm(self, msg_id: str, reply: dict[str, Any]) -> None:
        """The kernel's answer to "are you still running it?" after the interrupt's grace."""
        with self._lock:
            escalation = self.escalations.get(msg_id)
            if escalation is None:
                return
            action = escalation.on_confirm((reply.get("content") or {}).get("executing") == msg_id, self._clock())
            settling = escalation.phase is Phase.SETTLING
            self._arm(msg_id)
        if settling:
            self._take_reference(msg_id)
        if action is Action.KILL:
            self._kill(msg_id, self.cause)

    def _take_reference(self, msg_id: str) -> None:
        """(the watchdog's thread, not holding the lock) The tree's CPU as the kernel says it ended,
        which the settling checks compare with. Read outside the lock, so that a caller asking how
        the execution went (``interrupted``, ``phase_of``, as every result does) never waits for it.
        Who belongs to the tree comes from the shared scan (``SHARED_SCAN_MAX_AGE_S`` old at most):
        a fresh scan reads every process of the machine (over a millisecond, on the path of every
        cell's result), and what a stale one can miss, a process forked within that moment, only
        adds its CPU to the first check's difference: it can delay the quiet verdict by one check,
        never give it. The checks themselves scan afresh."""
        reference = self._read_cpu(SHARED_SCAN_MAX_AGE_S)
        if reference is not None:
            self._settle_from[msg_id] = reference

    def _read_cpu(self, max_age_s: float) -> tuple[float, float] | None:
        cpu_s = tree_cpu_s(self._root_pid, max_age_s)
        return None if cpu_s is None else (self._clock(), cpu_s)

    def _check_quiet(self, msg_id: str, now: float) -> Action:
        """A settling or paused execution: has the tree computed since the last sample?"""
        reading = self._read_cpu(0)
        reference = self._settle_from.get(msg_id)
        quiet, span = True, 0.0  # the tree is gone: nothing computes
        if reading is not None:
            self._settle_from[msg_id] = reading
            span = reading[0] - reference[0] if reference is not None else 0.0
            quiet = reference is not None and reading[1] - reference[1] <= QUIET_CPU_SHARE * max(span, 0.01)
        with self._lock:
            escalation = self.escalations.get(msg_id)
            settling = escalation is not None and escalation.phase is Phase.SETTLING
            if settling and self._replied is not None and not self._replied(msg_id):
                quiet = False  # no reply went to a client: the execution goes on, whatever the kernel said
            action = escalation.on_quiet_check(quiet, now, span) if escalation is not None else Action.NONE
            if escalation is not None and escalation.phase.final:
                self._settle_from.pop(msg_id, None)
        return action

    def _interrupt(self, msg_id: str, channels: KernelChannels, on_control: Callable[[dict[str, Any]], None]) -> None:
        """Ask the kernel to interrupt its own main thread (and show the deadline message); if it
        cannot answer in time (native code holding the GIL), signal the process group instead."""
        self._log.warning(
            "ivralo: execution %s exceeded deadline_ms=%s; interrupting (grace %s ms)",
            terminal_safe(msg_id),  # an id the kernel may have published itself (a forged "busy")
            self.policy.deadline_ms,
            self.policy.interrupt_grace_ms,
        )
        act_before = time.monotonic() + CONTROL_ANSWER_S  # CLOCK_MONOTONIC: the kernel compares it
        notice = DeadlineNotice(msg_id=msg_id, deadline_ms=self.policy.deadline_ms, act_before=act_before)
        sent = channels.send(names.MSG_DEADLINE_NOTICE, notice)
        reply = channels.reply_to(sent, act_before + REPLY_MARGIN_S, on_control) if sent else None
        if reply is not None and reply["content"].get("interrupted"):
            return
        # No answer in time, or it is no longer running that execution, or was too late.
        with contextlib.suppress(ProcessLookupError):
            self._signal_interrupt()

    def _arm(self, msg_id: str) -> None:
        """(holding the lock) The supervisor's kill time for ``msg_id`` follows its escalation: the
        deadline's remainder plus the grace and slack while it runs; none while paused or final."""
        escalation = self.escalations.get(msg_id)
        if self._backstop is None or escalation is None:
            return
        running = escalation.phase in (Phase.RUNNING, Phase.INTERRUPTING, Phase.CONFIRMING, Phase.SETTLING)
        if running and not escalation.paused:
            policy = escalation.policy
            left = (policy.deadline_ms + policy.interrupt_grace_ms) / 1000 - escalation.elapsed(self._clock())
            at = time.monotonic() + max(0.0, left) + BACKSTOP_SLACK_S
            if abs(at - self._armed.get(msg_id, math.inf)) > REARM_AFTER_S:
                self._armed[msg_id] = at
                self._backstop(msg_id, at)
        elif self._armed.pop(msg_id, None) is not None:
            self._backstop(msg_id, None)
