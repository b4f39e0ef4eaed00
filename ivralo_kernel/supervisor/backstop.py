"""[supervisor] The deadline backstop: when to end the kernel's whole tree, per execution.

Each running execution may have a kill time (CLOCK_MONOTONIC, system-wide), sent as
``kill-at:<msg_id>:<seconds>`` or ``kill-at:<msg_id>:off``. The kernel sends them on its stage pipe
from the cell's first line, because native code holding the GIL from there on would leave nobody
else to ask. Where a host enforces deadlines, the host sends them on its own pipe too, and only
the host's lines can postpone or cancel: a kernel line may only arm an execution, or bring its time
closer. Code in the kernel (which can write the stage pipe) cannot disarm its own deadline.
Where no host watches (a raw launch), the kernel's in-kernel watchdog is the authority.
"""

from __future__ import annotations

import math

from ivralo_kernel.protocol.pipe import KillAt


class Backstop:
    def __init__(self, kernel_may_disarm: bool) -> None:
        self.kernel_may_disarm = kernel_may_disarm
        self._arms: dict[str, float] = {}

    def apply(self, line: KillAt, from_host: bool) -> None:
        """One ``kill-at`` line (``protocol.pipe``): arm, move or (``at=None``) disarm an execution."""
        execution, at = line.execution, line.at
        authority = from_host or self.kernel_may_disarm
        if at is None:
            if authority:
                self._arms.pop(execution, None)
            return
        if authority:
            self._arms[execution] = at
        else:
            self._arms[execution] = min(at, self._arms.get(execution, math.inf))

    @property
    def kill_at(self) -> float | None:
        return min(self._arms.values()) if self._arms else None
