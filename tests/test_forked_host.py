"""A host that forks after running a kernel still gets working kernels in the child.

nbclient's parallel-notebooks test does this (a ProcessPoolExecutor forks the host), as does any
agent that uses ``multiprocessing``'s default start method on Linux. A child used to inherit the
loop's default executor with a worker thread that did not exist in it, and its kernel start waited
for ever. Judged on disk: each process's cell writes a file the test reads.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HOST_TIMEOUT_S = 150  # two kernel starts in sequence on a busy 2-core machine

SCRIPT = textwrap.dedent(
    """
    import os, sys
    import nbformat
    from nbclient import NotebookClient

    def run(tag):
        code = f"open({tag!r} + '.txt', 'w').write(str(6 * 7))"
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
        NotebookClient(nb, kernel_name="ivralo", timeout=60, startup_timeout=60).execute()

    run("parent")
    child = os.fork()
    if child == 0:
        try:
            run("child")
        finally:
            os._exit(0)
    _, status = os.waitpid(child, 0)
    sys.exit(os.waitstatus_to_exitcode(status))
    """
)


@pytest.mark.timeout(HOST_TIMEOUT_S + 30)
def test_a_forked_host_starts_kernels_that_answer(tmp_path: Path) -> None:
    host = subprocess.Popen(
        [sys.executable, "-c", SCRIPT],
        cwd=tmp_path,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = host.communicate(timeout=HOST_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(host.pid, signal.SIGKILL)  # the host and its forked child (kernels end with their host)
        output, _ = host.communicate()
        pytest.fail(f"the forked host's notebook did not finish in {HOST_TIMEOUT_S} s:\n{output[-3000:]}")
    for process in ("parent", "child"):
        written = tmp_path / f"{process}.txt"
        assert written.is_file() and written.read_text() == "42", f"no file from the {process}:\n{output[-3000:]}"
    assert host.returncode == 0, output[-3000:]
