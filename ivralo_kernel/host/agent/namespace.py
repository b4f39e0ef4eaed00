"""[host] One namespace operation (``get_var('x')``, ``inject_dataframe('df')``...) and its requests.

Each request is a silent execution whose ``user_expressions`` call ``kernel.dataplane``; the whole
operation is bounded by ``namespace_timeout_ms``. A timeout is not lethal: the worker and its
namespace stay, and the request's reply, when it comes late, is skipped by whatever reads shell next
(replies are matched by ``msg_id``, and what is already waiting is drained before each request).
Each request awaits its ``Outcome`` (host/watch/outcome.py): the reply, read here, or the worker's loss,
decided by whoever watches the kernel; nothing here polls.
"""

from __future__ import annotations

import ast
import asyncio
import queue
import time
from typing import Any

from ivralo_kernel.host.agent.dataplane import refusal
from ivralo_kernel.host.agent.kernel_worker import KernelWorker
from ivralo_kernel.host.watch.outcome import Lost, Outcome
from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.errors import IvraloError

# The kernel's data plane, by the hidden name the kernel gives it in every namespace (an import from
# here would be refused on the hermetic surface, and __import__ by the code gate).
DATAPLANE = names.DATAPLANE_NAME


class NamespaceTimeoutError(IvraloError, TimeoutError):
    """A namespace request did not answer in time; the worker and its namespace are untouched."""


class NamespaceWorkerLostError(IvraloError, RuntimeError):
    """The worker ended while a namespace request was in flight (killed, crashed): its namespace is gone."""


class WorkerGone(Exception):  # internal: the session turns it into NamespaceWorkerLostError
    pass


class NamespaceCall:
    def __init__(self, worker: KernelWorker, operation: str, budget_ms: int) -> None:
        self.worker, self.operation, self.budget_ms = worker, operation, budget_ms
        self._deadline = time.monotonic() + budget_ms / 1000

    async def request(self, expressions: dict[str, str], code: str = "pass") -> dict[str, Any]:
        """The ``user_expressions`` of one silent execution. Raises ``ValueError`` if ``code`` failed."""
        kc = self.worker.kc
        await self._drain()
        msg_id = kc.execute(code, silent=True, store_history=False, user_expressions=expressions)
        outcome = self.worker.outcome(msg_id)
        reading = outcome.read_by(asyncio.create_task(self._read_reply(outcome)))
        try:
            ended = await outcome.wait(max(0.0, self._deadline - time.monotonic()))
        except TimeoutError:
            outcome.abandon()
            raise self._timeout() from None
        finally:
            reading.cancel()
        if isinstance(ended, Lost) or ended.reply is None:
            raise WorkerGone
        content: dict[str, Any] = ended.reply["content"]
        if content.get("status") != "ok":
            raise ValueError(f"{self.operation}: {content.get('ename')}: {content.get('evalue')}")
        return dict(content.get("user_expressions") or {})

    async def _read_reply(self, outcome: Outcome) -> None:
        """Shell's messages until the reply to ``outcome``'s request, which it is given."""
        while True:
            reply: dict[str, Any] = await self.worker.kc.get_shell_msg(timeout=None)
            if reply["parent_header"].get("msg_id") == outcome.msg_id:
                outcome.reply(reply)
                return
            # else: a late reply to a call that timed out: it answers nobody now

    def left_s(self) -> float:
        """What is left of the operation's budget, in seconds."""
        return self._deadline - time.monotonic()

    def timeout(self) -> NamespaceTimeoutError:
        return self._timeout()

    async def value(self, expression: str) -> str:
        """The string ``expression`` returns in the kernel; its exception, raised here as the host's."""
        result = (await self.request({"value": expression})).get("value") or {}
        if result.get("status") != "ok":
            raise refusal(self.operation, result)
        text = ast.literal_eval(result["data"]["text/plain"])  # a str literal: parsed, never run
        if not isinstance(text, str):
            raise ValueError(f"{self.operation}: the kernel answered {type(text).__name__}, not text")
        return text

    async def _drain(self) -> None:
        """Replies already waiting (to calls that timed out) are dropped before the next request."""
        while True:
            try:
                await self.worker.kc.get_shell_msg(timeout=0)
            except queue.Empty:
                return

    def _timeout(self) -> NamespaceTimeoutError:
        return NamespaceTimeoutError(
            f"{self.operation} did not answer within namespace_timeout_ms={self.budget_ms} "
            f"(worker pid={self.worker.pid}); the worker and its namespace are untouched: "
            "a long call may still be running there"
        )
