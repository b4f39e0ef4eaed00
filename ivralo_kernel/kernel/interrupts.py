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
IPython's ``run_code``, one top-level statement at a time, where ipykernel's ``default_int_handler``
is in place: a C function, so no frame of ours shows in the traceback). Outside the code this
module's handler holds it: one that arrives before a statement runs is raised as that statement's
first act; one after the last statement is never raised (the cell is over, its reply on the way).
Outside executions (completion, inspection) SIGINT raises as ipykernel's handler does. An awaiting
cell's own handler (compat ``_cancel_on_sigint``) is left alone.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

# What runs instead of a cell's next statement when an interrupt was held for it: the KeyboardInterrupt
# is then raised inside IPython's handling, shown as every interrupt is (the deadline's message included).
RAISE_HELD = compile("raise KeyboardInterrupt", "<interrupt>", "exec")


class InterruptWindow:
    """The main thread's SIGINT handler during shell messages, swapped for ``default_int_handler``
    while the cell's code runs."""

    def __init__(self) -> None:
        self._executing = False
        self._held = False
        self.hold = self._hold  # one bound method: the handler compared with what signal.getsignal gives

    def _hold(self, signum: int, frame: FrameType | None) -> None:
        if not self._executing:
            signal.default_int_handler(signum, frame)
        self._held = True  # raised when a statement runs; dropped if none runs any more

    # -- the execution (execute_request) -------------------------------------------------------
    def begin_execution(self) -> None:
        self._executing, self._held = True, False

    def end_execution(self) -> None:
        self._executing = self._held = False

    # -- the cell's code (each top-level statement IPython runs) ---------------------------------
    def enter_code(self, code: CodeType) -> CodeType:
        """The code to run: ``code``, or the held interrupt instead of it."""
        _swap(self.hold, signal.default_int_handler)
        if self._held:
            self._held = False
            return RAISE_HELD
        return code

    def leave_code(self) -> None:
        """The code ended (or its exception is being shown): later SIGINTs are held."""
        _swap(signal.default_int_handler, self.hold)


def _swap(current: object, new: Callable[[int, FrameType | None], Any]) -> None:
    """``new`` as SIGINT's handler if ``current`` is it (not an awaiting cell's own); main thread only."""
    try:
        if signal.getsignal(signal.SIGINT) == current:
            signal.signal(signal.SIGINT, new)
    except ValueError:  # not the main thread: nothing of a cell's code runs elsewhere
        pass
