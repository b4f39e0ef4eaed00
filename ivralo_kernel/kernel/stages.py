"""[kernel] The kernel's side of the supervisor pipe, and the log of a failed start.

One line per message (``protocol.names.PIPE_*``): start-up stages as they are reached, and the
deadline backstop. The pipe stays open for the kernel's life; with no supervisor (a bare
``python -m ivralo_kernel.kernel``) every write is a no-op.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import MutableMapping
from pathlib import Path

from ivralo_kernel.protocol import names, pipe, worker_log


class SupervisorPipe:
    def __init__(self, env: MutableMapping[str, str]) -> None:
        raw = env.pop(names.ENV_STAGE_FD, "")
        self._fd: int | None = int(raw) if raw.isdigit() else None
        if self._fd is not None:
            os.set_inheritable(self._fd, False)  # user code's children must not hold it open
        self.reached: list[str] = []

    @property
    def connected(self) -> bool:
        return self._fd is not None

    def _send(self, line: pipe.PipeLine) -> None:
        if self._fd is None:
            return
        try:
            os.write(self._fd, pipe.encode(line))
        except OSError:  # the supervisor is gone; the parent-death signal takes care of us
            self._fd = None

    def reached_stage(self, stage: str) -> None:
        self.reached.append(stage)
        self._send(pipe.Stage(stage))

    def kill_at(self, execution: str, monotonic_deadline: float | None) -> None:
        """Ask the supervisor to end the tree at this CLOCK_MONOTONIC time if ``execution`` still runs
        (None: cancel; where the host enforces deadlines, only the host cancels).

        It is registered up front because when the time comes the kernel may be unable to ask:
        native code holding the GIL starves every Python thread, and only another process can act.
        """
        self._send(pipe.KillAt(execution, monotonic_deadline))

    def kill_now(self) -> None:
        self._send(pipe.KillNow())


def write_failure(workspace: str, reached: list[str], error: BaseException) -> Path:
    """Append the traceback of a failed start to ``<workspace>/.ivralo/python-worker.log``."""
    path = Path(workspace) / names.WORKER_LOG
    message = f"ivralo kernel failed to start: {type(error).__name__}: {error}"
    text = "".join(traceback.format_exception(error))
    worker_log.append(path, worker_log.start_failure(message, reached, text))
    return path
