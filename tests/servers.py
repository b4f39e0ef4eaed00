"""Start a Jupyter server (jupyter_server or JupyterLab) on loopback for a test, and stop it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def jupyter_server(module: str, root: Path, token: str, *extra: str, timeout: float = 90) -> Iterator[str]:
    """Run ``python -m module`` serving ``root`` on 127.0.0.1; yield its URL once /api/status answers.
    Readiness is that answer (no sleeps); the whole process group is stopped at the end."""
    port = free_port()
    cmd = [
        sys.executable, "-m", module, "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        "--ServerApp.allow_root=True", "--ServerApp.open_browser=False", *extra,
    ]  # fmt: skip
    log_path = root.parent / f"{root.name}-{module}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout
            while True:
                assert proc.poll() is None, log_path.read_text()[-3000:]
                request = urllib.request.Request(f"{url}/api/status", headers={"Authorization": f"token {token}"})
                try:
                    with urllib.request.urlopen(request, timeout=2) as response:
                        if response.status == 200:
                            break
                except OSError:
                    pass
                assert time.monotonic() < deadline, f"{module} did not come up; see {log_path}"
                time.sleep(0.05)
            yield url
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
