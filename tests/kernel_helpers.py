"""Drive a kernel with a blocking jupyter_client and collect what a cell produced."""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from typing import Any

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.channels import HBChannel

from ivralo_kernel.host.agent.outputs import CellOutput


@dataclass
class Executed:
    reply: dict[str, Any]
    stdout: str = ""
    stderr: str = ""
    outputs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def status(self) -> str:
        return str(self.reply["content"]["status"])


def execute(kc: BlockingKernelClient, code: str, timeout: float = 30, **kwargs: Any) -> Executed:
    msg_id = kc.execute(code, **kwargs)
    result = Executed(reply={})
    shown = CellOutput()  # the product's own collector (Session's and run's)
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no idle within {timeout} s for {code!r}")
        try:
            msg = kc.get_iopub_msg(timeout=remaining)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["header"]["msg_type"]
        if kind == "status" and msg["content"]["execution_state"] == "idle":
            break
        if kind == "stream":
            shown.add(msg)
        elif kind not in ("status", "execute_input"):
            result.outputs.append(msg)
    result.stdout, result.stderr = shown.streams.get("stdout", ""), shown.streams.get("stderr", "")
    while True:
        reply = kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            result.reply = reply
            return result


def answering(
    kc: BlockingKernelClient, code: str, answers: list[str], timeout: float = 60, wait_s: float = 0.0
) -> tuple[Executed, list[str]]:
    """Execute with stdin allowed, answering each input request in turn (after ``wait_s``: a person
    who takes their time; "" once the answers run out); returns what ran and the prompts seen."""
    msg_id = kc.execute(code, allow_stdin=True)
    prompts: list[str] = []
    result = Executed(reply={})
    shown = CellOutput()
    deadline = time.monotonic() + timeout
    idle = False
    while not idle:
        assert time.monotonic() < deadline, f"no idle; prompts {prompts}, stdout {result.stdout!r}"
        try:
            request = kc.get_stdin_msg(timeout=0.02)
            prompts.append(request["content"]["prompt"])
            if wait_s:
                time.sleep(wait_s)  # the person reading the question: what some tests are about
            kc.input(answers[len(prompts) - 1] if len(prompts) <= len(answers) else "")
        except queue.Empty:
            pass
        try:
            msg = kc.get_iopub_msg(timeout=0.02)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["header"]["msg_type"]
        if kind == "stream":
            shown.add(msg)
            result.stdout, result.stderr = shown.streams.get("stdout", ""), shown.streams.get("stderr", "")
        elif kind == "status":
            idle = msg["content"]["execution_state"] == "idle"
        elif kind != "execute_input":
            result.outputs.append(msg)
    return result, prompts


class PatientHeartbeat(HBChannel):  # type: ignore[misc]
    """A heartbeat that waits 5 s, not 1, before it calls a kernel dead: on a loaded 2-core machine a
    relayed ping can take longer than a second, and ``wait_for_ready`` then gives up on a live kernel
    ("Kernel died before replying to kernel_info"). A dead kernel is still seen, 5 s later."""

    time_to_dead = 5.0


def raw_client(connection_file: str) -> BlockingKernelClient:
    """A client for a kernel no manager started (VS Code's raw launch), loaded and with its channels on."""
    client = BlockingKernelClient(connection_file=connection_file, hb_channel_class=PatientHeartbeat)
    client.load_connection_file()
    client.start_channels()
    return client


def shut_down(kc: BlockingKernelClient, timeout: float) -> None:
    """Ask the kernel to shut down and wait for its reply: ``stop_channels`` closes the control
    socket with linger 0, which drops a request a loaded machine has not sent yet."""
    asked = kc.shutdown()
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, f"no shutdown_reply within {timeout} s"
        try:
            msg = kc.control_channel.get_msg(timeout=left)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") == asked:
            return


def reply_to(kc: BlockingKernelClient, msg_id: str, timeout: float) -> dict[str, Any]:
    """The shell reply to ``msg_id``; replies to earlier requests (``wait_for_ready`` asks for
    kernel_info every second, and a loaded machine answers late) are skipped, never taken for it."""
    deadline = time.monotonic() + timeout
    while True:
        reply = kc.get_shell_msg(timeout=max(0.1, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            return dict(reply)
