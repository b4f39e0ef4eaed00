"""Host side of ``test_fallback_reads.py``, run under the emulated container (``container.command``):
starts two kernels of ``argv[1]`` in ``argv[2]`` (no sandbox can be built there, so both run in the
fallback), runs ``argv[3]``'s code in the first with the second's connection file in
``OTHER_CONNECTION_FILE``, and prints JSON: the first kernel's layers, everything it sent on IOPub,
and the second's connection file path."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager
from jupyter_core.paths import jupyter_runtime_dir


def _run(kc: Any, code: str) -> list[dict[str, Any]]:
    msg_id = kc.execute(code, allow_stdin=False)
    seen = []
    while True:
        msg = kc.get_iopub_msg(timeout=240)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        seen.append({"type": msg["msg_type"], "content": msg["content"]})
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return seen


def main() -> None:
    kernel_name, workspace, code_file = sys.argv[1:4]
    # In Jupyter's runtime folder, as JupyterLab names them.
    runtime = Path(jupyter_runtime_dir())
    runtime.mkdir(parents=True, exist_ok=True)
    managers = [
        KernelManager(kernel_name=kernel_name, connection_file=str(runtime / f"kernel-{uuid.uuid4()}.json"))
        for _ in range(2)
    ]
    clients = []
    try:
        for manager in managers:
            manager.start_kernel(cwd=workspace)
            client = manager.client()
            client.start_channels()
            client.wait_for_ready(timeout=120)
            clients.append(client)
        layers = clients[0].kernel_info(reply=True, timeout=60)["content"]["ivralo"]["layers"]
        other = managers[1].connection_file
        code = Path(code_file).read_text().replace("OTHER_CONNECTION_FILE", repr(other))
        print(json.dumps({"layers": layers, "iopub": _run(clients[0], code), "other": other}))
    finally:
        for client in clients:
            client.stop_channels()
        for manager in managers:
            if manager.has_kernel:
                manager.shutdown_kernel(now=True)


if __name__ == "__main__":
    main()
