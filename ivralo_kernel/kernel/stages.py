"""[kernel] Report start-up stages to the supervisor, and the reason for a failed start to the log."""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

from ivralo_kernel.protocol import names


class StageReporter:
    """Writes each stage name to the supervisor's pipe (when there is one) as it is reached."""

    def __init__(self, env: dict[str, str] | os._Environ[str]) -> None:
        raw = env.pop(names.ENV_STAGE_FD, "")
        self._fd: int | None = int(raw) if raw.isdigit() else None
        self.reached: list[str] = []

    def reached_stage(self, stage: str) -> None:
        self.reached.append(stage)
        if self._fd is None:
            return
        try:
            os.write(self._fd, stage.encode() + b"\n")
        except OSError:
            self._fd = None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def write_failure(workspace: str, reached: list[str], error: BaseException) -> Path:
    """Append the traceback of a failed start to ``<workspace>/.ivralo/python-worker.log``."""
    path = Path(workspace) / names.WORKER_LOG
    text = "".join(traceback.format_exception(error))
    entry = (
        f"{time.strftime('%Y-%m-%d %H:%M:%S')} ivralo kernel failed to start (pid {os.getpid()})\n"
        f"  last stage reached: {reached[-1] if reached else 'none'}\n{text}"
    )
    path.parent.mkdir(exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(entry)
    return path
