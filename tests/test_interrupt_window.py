"""A second SIGINT never costs a cell its reply (kernel/interrupts.py).

ipykernel loses the execute_reply when a SIGINT lands after the cell's code ended: measured here, two
interrupts 4-26 ms apart during ``time.sleep`` lost 7 replies of 60 before the fix, none after. The
host then waits for a reply that never comes and kills the kernel at its deadline + grace.
"""

from __future__ import annotations

import queue
import signal
import time
from typing import Any

import pytest
from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager

from ivralo_kernel.kernel.interrupts import RAISE_HELD, InterruptWindow

TRIALS = 40  # before the fix, each lost its reply with p ~ 0.12: all 40 answered with p < 1 %
SLEEPER = "print('asleep', flush=True)\nimport time\ntime.sleep(30)"


def _wait_for(kc: BlockingKernelClient, msg_id: str, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = kc.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if what == "asleep" and msg["msg_type"] == "stream" and "asleep" in msg["content"]["text"]:
            return
        if what == "idle" and msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return
    raise AssertionError(f"no {what} within {timeout} s")


def _reply(kc: BlockingKernelClient, msg_id: str, timeout: float) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = kc.get_shell_msg(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") == msg_id:
            return msg
    return None


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_interrupts_close_together_still_answer_the_cell(km: KernelManager, kc: BlockingKernelClient) -> None:
    lost = []
    for trial in range(TRIALS):
        gap_s = (trial % 20) * 0.002  # 0-38 ms: a double press, or the host's fallback after the kernel's own
        msg_id = kc.execute(SLEEPER)
        _wait_for(kc, msg_id, "asleep", 30)
        km.interrupt_kernel()
        time.sleep(gap_s)  # the stimulus: the second press, gap_s later
        km.interrupt_kernel()
        reply = _reply(kc, msg_id, 10)
        if reply is None:
            lost.append(f"{gap_s * 1000:.0f} ms")
            break  # the kernel's state is unknown now
        assert reply["content"]["ename"] == "KeyboardInterrupt", reply["content"]
        _wait_for(kc, msg_id, "idle", 10)
    assert not lost, f"no execute_reply after two interrupts {lost[0]} apart"
    # And one interrupt still stops a cell at once, the cell after it runs as usual.
    msg_id = kc.execute(SLEEPER)
    _wait_for(kc, msg_id, "asleep", 30)
    km.interrupt_kernel()
    reply = _reply(kc, msg_id, 10)
    assert reply is not None and reply["content"]["ename"] == "KeyboardInterrupt"


@pytest.mark.fast
def test_a_sigint_is_raised_in_the_code_and_held_outside_it_until_the_cell_ends() -> None:
    window = InterruptWindow()
    code = compile("x = 1", "<cell>", "exec")
    previous = signal.signal(signal.SIGINT, window.hold)  # as pre_handler_hook sets it
    try:
        with pytest.raises(KeyboardInterrupt):  # outside an execution: as ipykernel's own handler
            window.hold(signal.SIGINT, None)
        window.begin_execution()
        window.hold(signal.SIGINT, None)  # before the code runs: held...
        assert window.enter_code(code) is RAISE_HELD  # ...and raised as its first act
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # in the code: a C handler
        window.leave_code()
        assert signal.getsignal(signal.SIGINT) == window.hold
        assert window.enter_code(code) is code  # once
        window.leave_code()
        window.hold(signal.SIGINT, None)  # after the last statement: never raised, the reply is on its way
        window.end_execution()
        window.begin_execution()
        assert window.enter_code(code) is code  # the next cell starts clean
        window.leave_code()
        window.end_execution()
        awaiting = signal.signal(signal.SIGINT, lambda *_: None)  # an awaiting cell's own handler...
        window.begin_execution()
        window.enter_code(code)
        assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler  # ...is left alone
        window.leave_code()
        window.end_execution()
        del awaiting
    finally:
        signal.signal(signal.SIGINT, previous)
