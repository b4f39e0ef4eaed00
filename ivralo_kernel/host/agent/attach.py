"""[host] ``Session.connect(connection_file)``: an agent's session on a kernel the person already runs.

ivralo did not start that process, so it cannot put guards around it afterwards: no sandbox, no
write guard, no deadline it can enforce by killing the tree. The session says so plainly, once,
unless the kernel is an ivralo kernel (its ``kernel_info`` carries the ``ivralo`` section), in which
case it reports the layers that kernel has. Runs keep the agent contract (a ``str``, or the error
dict) and carry the kernel's ``effects`` when it reports them.
"""

from __future__ import annotations

import asyncio
import os
import queue
import time
from typing import Any

from jupyter_client.asynchronous.client import AsyncKernelClient

from ivralo_kernel.host.agent.blocking import LoopThread
from ivralo_kernel.host.agent.outputs import CellOutput, RunError, RunText, effects_in, error_result, with_effects
from ivralo_kernel.protocol import IvraloError, names

NOT_OURS = (
    "this kernel was not started by ivralo, so its guards cannot be applied to it afterwards: code here "
    "runs with the full rights of the process that runs it (no sandbox, no write guard, no deadline "
    "ivralo can enforce). Start the kernel with the ivralo kernelspec, or use Session(workspace=...), "
    "to have them"
)
READY_TIMEOUT_S = 30.0
POLL_S = 0.05


class AttachError(IvraloError):
    """The connection file cannot be used, or no kernel answers there."""


class AttachedSession:
    """Created by ``Session.connect``; ``async with`` it, or call ``close()`` (the kernel keeps running)."""

    def __init__(self, connection_file: str, timeout_s: float | None = None) -> None:
        path = os.path.abspath(connection_file)
        if not os.path.isfile(path):
            raise AttachError(f"{connection_file}: no such connection file. Give the kernel's kernel-*.json.")
        self.connection_file = path
        self.timeout_s = timeout_s  # per run; None: as long as the cell runs (we cannot end it anyway)
        self.kernel_info: dict[str, Any] = {}
        self.note: str | None = None  # the one thing to know about this kernel's guards
        self._client = AsyncKernelClient(connection_file=path)
        self._lock = asyncio.Lock()

    @property
    def is_ivralo(self) -> bool:
        """Whether the kernel is an ivralo kernel (its ``kernel_info`` has the ``ivralo`` section)."""
        return bool(self.kernel_info.get(names.KERNEL_INFO_SECTION))

    @property
    def layers(self) -> dict[str, Any]:
        """The protections the kernel reports (an ivralo kernel), else empty."""
        return dict((self.kernel_info.get(names.KERNEL_INFO_SECTION) or {}).get("layers") or {})

    async def open(self) -> AttachedSession:
        """Connects to the kernel and reads its ``kernel_info``; an ``AttachError`` says why it cannot."""
        try:
            self._client.load_connection_file()
        except (OSError, ValueError, KeyError) as exc:
            raise AttachError(f"{self.connection_file}: not a kernel connection file ({exc})") from None
        self._client.start_channels()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                await self._client.wait_for_ready(timeout=max(0.1, deadline - time.monotonic()))
                reply = await self._client.kernel_info(reply=True, timeout=max(0.1, deadline - time.monotonic()))
                break
            except (RuntimeError, TimeoutError) as exc:
                # "Kernel died before replying": a client without a manager judges by the heartbeat, which
                # a kernel still starting (the person's, just launched, on a busy machine) misses for a
                # second. Ask again until the deadline; only then is it not there.
                if time.monotonic() < deadline and "died" in str(exc):
                    continue
                self._client.stop_channels()
                raise AttachError(
                    f"no kernel answered at {self.connection_file} within {READY_TIMEOUT_S:g} s ({exc}); is it running?"
                ) from None
        self.kernel_info = dict(reply["content"])
        if not self.is_ivralo:
            self.note = NOT_OURS
        return self

    async def __aenter__(self) -> AttachedSession:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Let go of the kernel; it keeps running, as it did before."""
        self._client.stop_channels()

    async def run(self, code: str) -> RunText | RunError:
        """Run ``code``; its output as a ``str``, or the error dict. The first result on a kernel ivralo
        did not start begins with the note saying so."""
        async with self._lock:
            client = self._client
            msg_id = client.execute(code, allow_stdin=False, stop_on_error=True)
            out = CellOutput()
            until = None if self.timeout_s is None else time.monotonic() + self.timeout_s
            idle = False
            while not idle:
                if until is not None and time.monotonic() > until:
                    return with_effects(
                        error_result(out.text, f"no answer within {self.timeout_s:g} s; the cell may still run"), None
                    )
                try:
                    msg = await client.get_iopub_msg(timeout=POLL_S)
                except queue.Empty:
                    continue
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                idle = out.take(msg)
            reply = await self._reply(msg_id)
        content = reply.get("content") or {}
        effects = effects_in(reply.get("metadata"))
        note, self.note = (f"[ivralo] {self.note}\n" if self.note else ""), None
        if out.error is not None or content.get("status") == "error":
            error = out.error or f"{content.get('ename')}: {content.get('evalue')}"
            return with_effects(error_result(note + out.text, error), effects)
        return with_effects(note + out.text, effects)

    async def _reply(self, msg_id: str) -> dict[str, Any]:
        while True:  # replies to other requests (a late one) are skipped, never taken for ours
            reply = await self._client.get_shell_msg(timeout=READY_TIMEOUT_S)
            if reply["parent_header"].get("msg_id") == msg_id:
                return dict(reply)


class SyncAttachedSession:
    """``AttachedSession``, blocking (``SyncSession.connect``): ``with SyncSession.connect(path) as s:
    s.run(code)``. It runs its own event loop on a thread; ``close()`` ends it (the kernel keeps running)."""

    def __init__(self, connection_file: str, timeout_s: float | None = None) -> None:
        self._loop = LoopThread("ivralo-attached")
        try:
            self._session = self._loop.call(_make_attached(connection_file, timeout_s))
        except BaseException:
            self._loop.stop()
            raise

    @property
    def connection_file(self) -> str:
        """The kernel's connection file (absolute)."""
        return self._session.connection_file

    @property
    def timeout_s(self) -> float | None:
        """Each run's bound in seconds; None: as long as the cell runs."""
        return self._session.timeout_s

    @property
    def kernel_info(self) -> dict[str, Any]:
        """The kernel's ``kernel_info_reply`` content, once opened."""
        return self._session.kernel_info

    @property
    def note(self) -> str | None:
        """The one thing to know about this kernel's guards (None for an ivralo kernel)."""
        return self._session.note

    @property
    def is_ivralo(self) -> bool:
        """``AttachedSession.is_ivralo``."""
        return self._session.is_ivralo

    @property
    def layers(self) -> dict[str, Any]:
        """``AttachedSession.layers``."""
        return self._session.layers

    def open(self) -> SyncAttachedSession:
        """``AttachedSession.open``, blocking."""
        self._loop.call(self._session.open())
        return self

    def __enter__(self) -> SyncAttachedSession:
        try:
            return self.open()
        except BaseException:
            self._loop.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, code: str) -> RunText | RunError:
        """``AttachedSession.run``, blocking."""
        return self._loop.call(self._session.run(code))

    def close(self) -> None:
        """``AttachedSession.close``, blocking; then its own loop ends. Calling it again does nothing."""
        if self._loop.stopped:
            return
        self._loop.call(self._session.close())
        self._loop.stop()


async def _make_attached(connection_file: str, timeout_s: float | None) -> AttachedSession:
    return AttachedSession(connection_file, timeout_s)  # built in the loop's thread: its lock binds there
