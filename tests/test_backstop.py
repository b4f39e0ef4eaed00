"""The supervisor's deadline backstop: where a host enforces deadlines, nothing the kernel writes on
its pipe can postpone or cancel a kill time; only the host's own pipe can."""

from __future__ import annotations

import pytest

from ivralo_kernel.supervisor.backstop import Backstop

pytestmark = pytest.mark.fast  # starts no process: the fast tier (make test-fast)


def test_under_a_host_the_kernel_may_only_arm_or_bring_closer() -> None:
    b = Backstop(kernel_may_disarm=False)
    b.apply("exec-1:100.0", from_host=False)  # the kernel, from the cell's first line
    assert b.kill_at == 100.0
    b.apply("exec-1:off", from_host=False)  # forged by code in the kernel
    b.apply("exec-1:1e12", from_host=False)
    assert b.kill_at == 100.0
    b.apply("exec-1:90.0", from_host=False)
    assert b.kill_at == 90.0
    b.apply("exec-1:102.0", from_host=True)  # the host's own time for it replaces the kernel's
    assert b.kill_at == 102.0
    b.apply("exec-1:off", from_host=True)  # the host saw it end and the tree settle
    assert b.kill_at is None


def test_without_a_host_the_in_kernel_watchdog_is_the_authority() -> None:
    b = Backstop(kernel_may_disarm=True)
    b.apply("exec-1:100.0", from_host=False)
    b.apply("exec-1:off", from_host=False)
    assert b.kill_at is None


def test_garbage_arms_nothing() -> None:
    b = Backstop(kernel_may_disarm=False)
    for value in ("exec-1:nan", "exec-1:inf", "exec-1:soon", ""):
        b.apply(value, from_host=False)
    assert b.kill_at is None
