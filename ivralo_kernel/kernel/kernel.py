"""[kernel] ``IvraloKernel``: IPython's kernel with one thread for user code and an ``ivralo`` report.

* User code runs only on the main thread, where SIGINT reaches it: ``execute_request`` on the
  control channel is answered with an error (ipykernel would run it on the Control thread), and
  subshells are neither advertised nor created (their cells cannot be interrupted).
* ``kernel_info_reply`` carries an ``ivralo`` section: version, pid, bootstrap time, workspace,
  role, and which protection layers are in force. Hosts treat a worker as ready only once it is
  there.
"""

from __future__ import annotations

import os
from typing import Any

from ipykernel.ipkernel import IPythonKernel

from ivralo_kernel import __version__
from ivralo_kernel.kernel.launch_state import STATE
from ivralo_kernel.protocol import names

CONTROL_EXECUTE_REFUSED = (
    "execute_request on the control channel is refused: ivralo runs code only on the shell "
    "channel, on the one thread where interrupts and deadlines reach it. Send it on shell."
)
SUBSHELLS_REFUSED = (
    "subshells are not supported by the ivralo kernel: code in a subshell cannot be interrupted "
    "or held to a deadline. Send the request without a subshell_id."
)


class IvraloKernel(IPythonKernel):
    implementation = names.IMPLEMENTATION
    implementation_version = __version__

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # Same message type, different channel: only the control route changes.
        self.control_handlers["execute_request"] = self._refuse_control_execute
        self.control_handlers["create_subshell_request"] = self._refuse_subshell

    @property
    def banner(self) -> str:  # type: ignore[override]
        lines = [super().banner.rstrip("\n"), f"ivralo-kernel {__version__}: guarded session in {STATE.workspace}"]
        lines += [f"ivralo: {note}" for note in STATE.notes]
        return "\n".join(lines) + "\n"

    @property
    def kernel_info(self) -> dict[str, Any]:  # type: ignore[override]
        info: dict[str, Any] = dict(super().kernel_info)
        info["supported_features"] = [f for f in info.get("supported_features", []) if f != "kernel subshells"]
        info[names.KERNEL_INFO_SECTION] = {
            "version": __version__,
            "pid": os.getpid(),
            "bootstrap_ms": STATE.bootstrap_ms,
            "workspace": STATE.workspace,
            "role": STATE.role,
            "layers": dict(STATE.layers),
            "scrubbed": list(STATE.scrubbed),
        }
        return info

    async def _refuse_control_execute(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        content = {
            "status": "error",
            "ename": "PermissionError",
            "evalue": CONTROL_EXECUTE_REFUSED,
            "traceback": [f"PermissionError: {CONTROL_EXECUTE_REFUSED}"],
            "execution_count": self.execution_count,
        }
        assert self.session is not None
        self.session.send(stream, "execute_reply", content, parent, ident)

    async def _refuse_subshell(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        content = {"status": "error", "ename": "RuntimeError", "evalue": SUBSHELLS_REFUSED, "traceback": []}
        assert self.session is not None
        self.session.send(stream, "create_subshell_reply", content, parent, ident)
