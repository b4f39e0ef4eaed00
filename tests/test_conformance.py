"""Jupyter's own kernel conformance suite against the installed ``ivralo`` kernelspec."""
# ruff: noqa: RUF012 - jupyter_kernel_test reads these as plain class attributes

from __future__ import annotations

import jupyter_kernel_test
import pytest
from jupyter_client.manager import KernelManager


class IvraloConformance(jupyter_kernel_test.KernelTests):
    kernel_name = "ivralo"
    language_name = "python"
    file_extension = ".py"
    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('test', file=sys.stderr)"
    completion_samples = [{"text": "zi", "matches": {"zip"}}]
    complete_code_samples = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n\n"]
    incomplete_code_samples = ["print('''hello", "def f(x):\n  x*2"]
    invalid_code_samples = ["import = 7q"]
    code_page_something = "zip?"
    code_generate_error = "raise ValueError('deliberate')"
    code_execute_result = [
        {"code": "1+2+3", "result": "6"},
        {"code": "[n*n for n in range(1, 4)]", "result": "[1, 4, 9]"},
    ]
    code_display_data = [
        {"code": "from IPython.display import HTML, display; display(HTML('<b>test</b>'))", "mime": "text/html"},
        {"code": "from IPython.display import Math, display; display(Math('\\\\frac{1}{2}'))", "mime": "text/latex"},
    ]
    code_history_pattern = "1?2*"
    supported_history_operations = ("tail", "search")
    code_inspect_sample = "zip"
    code_clear_output = "from IPython.display import clear_output; clear_output()"


class IvraloIopubWelcome(jupyter_kernel_test.IopubWelcomeTests):
    """The client's first IOPub message is its own ``iopub_welcome``, though the host's watchdog
    subscribed before it (the kernel's XPUB reports every subscriber)."""

    kernel_name = "ivralo"
    support_iopub_welcome = True


@pytest.mark.slow
def test_every_fresh_kernel_welcomes_its_client_first() -> None:
    """20 kernels in a row: the watchdog subscribes first each time, and the client still gets its
    own welcome as its first IOPub message (jupyter_kernel_test's check, repeated)."""
    for run in range(20):
        km = KernelManager(kernel_name="ivralo")
        km.start_kernel()
        kc = km.client()
        try:
            kc.start_channels()
            first = kc.get_iopub_msg(timeout=30)
            assert first["header"]["msg_type"] == "iopub_welcome", f"run {run}: {first['header']['msg_type']}"
            assert first["content"]["subscription"] == "", f"run {run}: {first['content']}"
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
