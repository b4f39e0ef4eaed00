"""[kernel] Where a SIGINT lands during a cell: in the cell's own code, never in the bookkeeping around it.

ipykernel runs every shell message under ``default_int_handler``. A KeyboardInterrupt raised after the
cell's code has ended (while IPython shows the first interrupt's traceback, or while ipykernel builds
and sends the reply) is caught by ``dispatch_shell`` ("KeyboardInterrupt caught in kernel.") and the
``execute_reply`` is never sent. Measured with plain ipykernel 7.4: two SIGINTs 8-36 ms apart during
``time.sleep(10)`` lost 5 replies of 40. A person's double press of the interrupt button does this, and
so does the host's fallback SIGINT when it lands just after the kernel interrupted itself for a
deadline (the kernel's answer reached the host late, on a loaded machine). ivralo's host then waits
for a reply that never comes, and kills the kernel at deadline + grace: the soak saw a sleeping cell
killed instead of interrupted about once in 50-500 such calls.

So during an execution SIGINT raises KeyboardInterrupt only while the cell's own code runs (inside
IPython's ``run_code``, one top-level statement at a time): one that arrives before a statement runs
is held and raised as that statement's first act; one after the last statement is never raised (the
cell is over, its reply on the way); a second one within ``COALESCE_S`` of the first is the same
press. Outside executions (completion, inspection) SIGINT raises as ipykernel's handler does.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import CodeType, FrameType

# Two SIGINTs closer than this are one interrupt: the host's fallback after the kernel's own, or a
# double press. A cell that catches KeyboardInterrupt and goes on can be interrupted again after it.
COALESCE_S = 0.05
# What runs instead of a cell's next statement when an interrupt was held for it: the KeyboardInterrupt
# is then raised inside IPython's handling, shown as every interrupt is (the deadline's message included).
RAISE_HELD = compile("raise KeyboardInterrupt", "<interrupt>", "exec")


class InterruptWindow:
    """The main thread's SIGINT handler during shell messages, and when the cell's code runs."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._executing = False
        self._in_code = False
        self._held = False
        self._raised_at: float | None = None

    def handler(self, signum: int, frame: FrameType | None) -> None:
        if not self._executing:
            raise KeyboardInterrupt
        if not self._in_code:
            self._held = True  # raised when the code runs; dropped if none runs any more
            return
        now = self._clock()
        if self._raised_at is not None and now - self._raised_at < COALESCE_S:
            return
        self._raised_at = now
        raise KeyboardInterrupt

    # -- the execution (do_execute) ----------------------------------------------------------
    def begin_execution(self) -> None:
        self._executing, self._in_code, self._held, self._raised_at = True, False, False, None

    def end_execution(self) -> None:
        self._executing = self._in_code = self._held = False

    # -- the cell's code (each top-level statement IPython runs) ---------------------------------
    def enter_code(self, code: CodeType) -> CodeType:
        """The code to run: ``code``, or the held interrupt instead of it."""
        self._in_code = True
        if self._held:
            self._held = False
            self._raised_at = self._clock()
            return RAISE_HELD
        return code

    def leave_code(self) -> None:
        """The code ended (or its exception is being shown): later SIGINTs are held or dropped."""
        self._in_code = False
