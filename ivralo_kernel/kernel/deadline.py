"""[kernel] Deadlines seen from inside the kernel.

Two jobs:

* ``DeadlineNotices``: the host's watchdog says, over control, "the interrupt that follows is the
  deadline of execution X". The KeyboardInterrupt of X is then shown as the deadline message, not
  as a traceback, in JupyterLab as well as to an agent.
* ``InKernelWatchdog``: for a kernel that no ivralo host watches (VS Code runs kernel.json argv
  itself). At the deadline it interrupts the main thread with ``pthread_kill`` (``interrupt_main``
  waits for the blocking call to return); the kill after the grace is registered with the
  supervisor up front, because by then the kernel may be unable to ask: native code holding the GIL
  starves every Python thread, and only another process can act.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

from ivralo_kernel.kernel.stages import SupervisorPipe
from ivralo_kernel.protocol import names

# Slack between the end of the grace and the supervisor's kill. The host watchdog kills at about
# grace + 0.1 s (after asking over control); this catches what it could not see: native code that
# holds the GIL from a cell's first line starves the kernel's IOPub thread, so the host never gets
# that execution's "busy". Measured (bench/deadline_precision.py): the tree is gone ~25 ms after
# the supervisor acts and the caller answered ~15 ms later, so 0.12 s keeps the promised
# deadline + grace + 250 ms. If both act, both kill the same tree: harmless.
BACKSTOP_SLACK_S = 0.12


def interrupt_cell(main_thread: int) -> None:
    """Interrupt the cell as a terminal's Ctrl-C does: SIGINT to the kernel's main thread, and to
    the other processes of its group (the cell's children: ``subprocess.run`` of a program).

    The kernel's own SIGINT is thread-directed: a process-directed one (killpg) is taken by whichever
    thread Linux picks, often a running user thread, and then a main thread blocked in ``join()`` or a
    lock never wakes. A child that got no SIGINT of its own is waited for by ``Popen`` for 0.25 s,
    then killed: on a loaded machine that outlasted the grace, and the whole kernel was killed for it.
    """
    signal.pthread_kill(main_thread, signal.SIGINT)
    me = os.getpid()
    group = os.getpgid(0)
    if group != me:  # not a group of our own (no supervisor gave us one): signal nobody else's
        return
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to ask about
            if os.getpgid(int(entry)) == group:
                os.kill(int(entry), signal.SIGINT)


class DeadlineNotices:
    """msg_id -> deadline_ms of executions interrupted for their deadline. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._notices: dict[str, int] = {}

    def add(self, msg_id: str, deadline_ms: int) -> None:
        with self._lock:
            self._notices[msg_id] = deadline_ms

    def get(self, msg_id: str | None) -> int | None:
        with self._lock:
            return self._notices.get(msg_id) if msg_id else None

    def discard(self, msg_id: str | None) -> None:
        with self._lock:
            self._notices.pop(msg_id or "", None)

    @staticmethod
    def text(deadline_ms: int) -> str:
        return names.INTERRUPTED_TEXT.format(deadline_ms=deadline_ms)


class SupervisorBackstop:
    """Registers each execution's kill time with the supervisor, from the main thread, before any
    user code runs; cancels it when the execution ends."""

    def __init__(self, deadline_ms: int, grace_ms: int, pipe: SupervisorPipe, host_enforces: bool = False) -> None:
        self.deadline_s, self.grace_s = deadline_ms / 1000, grace_ms / 1000
        self._pipe = pipe
        # Where a host enforces deadlines the supervisor takes only the kernel's arming (a kernel's
        # cancel or later time is ignored there): the other lines would only wake its process, on
        # each reply's way.
        self._arm_only = host_enforces
        self._execution = ""
        self._due: float | None = None
        self._left: float | None = None  # while paused: what was left of the deadline

    def started(self, execution: str) -> float:
        self._execution = execution
        self._due = time.monotonic() + self.deadline_s
        self._pipe.kill_at(execution, self._due + self.grace_s + BACKSTOP_SLACK_S)
        return self._due

    def pause(self) -> None:
        """The cell waits for the host (a person is answering): that time does not count. (Where the
        host enforces deadlines, the supervisor takes this from the host alone.)"""
        if self._due is not None and self._left is None:
            self._left = max(0.0, self._due - time.monotonic())
            if not self._arm_only:
                self._pipe.kill_at(self._execution, None)

    def resume(self) -> None:
        if self._left is not None:
            self._due, self._left = time.monotonic() + self._left, None
            if not self._arm_only:  # (a later time than the first: ignored under a host)
                self._pipe.kill_at(self._execution, self._due + self.grace_s + BACKSTOP_SLACK_S)

    def finished(self) -> None:
        self._due = self._left = None
        if not self._arm_only:
            self._pipe.kill_at(self._execution, None)


class InKernelWatchdog:
    """The interrupt at the deadline, for a kernel no ivralo host watches. One daemon thread;
    ``started``/``finished`` bracket each execution on the main thread."""

    def __init__(self, deadline_ms: int, notices: DeadlineNotices) -> None:
        self.deadline_s, self.deadline_ms = deadline_ms / 1000, deadline_ms
        self._notices = notices
        self._main = threading.main_thread().ident
        self._cond = threading.Condition()
        self._current: tuple[str, float] | None = None  # (msg_id, monotonic deadline)
        threading.Thread(target=self._run, name="ivralo-deadline", daemon=True).start()

    def started(self, msg_id: str, due: float) -> None:
        with self._cond:
            self._current = (msg_id, due)
            self._cond.notify()

    def finished(self) -> None:
        with self._cond:
            self._current = None
            self._cond.notify()

    def _run(self) -> None:
        assert self._main is not None
        while True:
            with self._cond:
                while self._current is None:
                    self._cond.wait()
                msg_id, due = self._current
                remaining = due - time.monotonic()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                self._current = None  # one interrupt per execution; the supervisor does the rest
            self._notices.add(msg_id, self.deadline_ms)
            interrupt_cell(self._main)
