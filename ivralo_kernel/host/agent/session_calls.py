"""[host] What ``Session``'s calls do underneath: one cell's run, awaited as one ``Outcome`` (its
reply, or the worker's loss, decided once by whoever watches the kernel: host/watch/outcome.py); the lost
worker's message and the restart-loop note; the worker's start and its return to the pool; one
namespace operation, alone on the worker. Written against ``KernelWorker`` (host/agent/kernel_worker.py),
so a local kernel and a gateway's go through the same code.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from ivralo_kernel.host.agent.code_gate import DONE_WITH_ERRORS, is_refusal
from ivralo_kernel.host.agent.dataplane import (
    TransferRefusedError,
    decode_inline,
    kernel_json,
    require_arrow,
    transfer_cap,
)
from ivralo_kernel.host.agent.gateway.worker import GatewayPool
from ivralo_kernel.host.agent.kernel_worker import KernelWorker
from ivralo_kernel.host.agent.namespace import DATAPLANE, NamespaceCall, NamespaceWorkerLostError, WorkerGone
from ivralo_kernel.host.agent.outputs import (
    CellOutput,
    assigned_names,
    effects_in,
    error_result,
    lost_names_message,
)
from ivralo_kernel.host.agent.pool import WorkerPool
from ivralo_kernel.host.history.ledger import HistoryRecorder
from ivralo_kernel.host.sandbox.limits import available_memory
from ivralo_kernel.host.settings.config import WorkerConfig
from ivralo_kernel.host.watch.escalation import Phase
from ivralo_kernel.host.watch.outcome import Lost, Outcome
from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.messages import Effects
from ivralo_kernel.protocol.processes import describe_exit

RunResult = str | dict[str, str]
AnyWorker = KernelWorker  # a local kernel, or one a Kernel Gateway runs (host/agent/kernel_worker.py)

# Evaluated by the kernel after each successful cell (user_expressions): the names, never values.
_NAMES_EXPR = (
    "sorted(k for k in get_ipython().user_ns if not k.startswith('_') and k not in get_ipython().user_ns_hidden)"
)
USER_INTERRUPT_CAUSE = "interrupted: stopped at once by the user"
USER_RESTART_CAUSE = "restarted: ended by the user's restart; a fresh kernel takes its place"
ABORTED_TEXT = (
    "aborted: the kernel did not run this code, because a request sent just before it failed and "
    "ipykernel drops what arrives meanwhile (stop_on_error); run it again"
)
RESTART_WINDOW_S = 60.0
RESTART_WARNING_AT = 3
log = logging.getLogger("ivralo_kernel.host.agent.session")  # the name the restart warning has always had


class SessionCalls:
    """The private half of ``Session``: the state its calls share, and what every call does under it."""

    config: WorkerConfig
    _pool: WorkerPool | GatewayPool
    _worker: KernelWorker | None
    _lock: asyncio.Lock
    _known_names: list[str]
    _running_code: str | None  # the call in flight, whose own assignments a loss may also take
    _user_stop: str | None  # why the user ended the worker (interrupt, restart), until its loss is reported
    _restarts: deque[tuple[float, str]]
    _restart_note: str | None
    _asked_s: float
    _asking_since: float | None
    _effects: Effects | None
    _images: tuple[str, ...]
    grants: tuple[str, ...]
    ask: Callable[[str, tuple[str, ...]], Awaitable[str]] | None

    async def _ensure_started(self) -> AnyWorker:
        worker = self._worker
        if worker is not None and worker.retired is None and await worker.is_alive():
            return worker
        if worker is not None:  # retired by the pool while idle: a fresh namespace is no error
            self._worker = None
            self._known_names = []
            await self._give_back(worker)
        self._worker = await self._pool.acquire()
        self._connect_asker(self._worker)
        return self._worker

    def _connect_asker(self, worker: AnyWorker) -> None:
        """This session's grants go to the worker's broker; questions the host has for it (e.g. an
        unknown host) go to ``ask``, on our loop."""
        worker.take_session(frozenset(self.grants), self.ask, self._asking)

    def _asking(self, on: bool) -> None:
        """A question to ``ask`` began (True) or ended: the person's time, kept apart."""
        if on:
            self._asking_since = time.monotonic()
        elif self._asking_since is not None:
            self._asked_s += time.monotonic() - self._asking_since
            self._asking_since = None

    async def _execute(self, worker: AnyWorker, code: str) -> RunResult:
        """One cell: its output is read until idle, then its reply, while whoever watches the kernel
        may decide a loss first; the ``Outcome`` says which came first, once."""
        kc = worker.kc
        msg_id = kc.execute(code, allow_stdin=False, stop_on_error=True, user_expressions={"names": _NAMES_EXPR})
        out = CellOutput()
        self._asked_s = 0.0
        outcome = worker.outcome(msg_id)
        reading = outcome.read_by(asyncio.create_task(self._read_cell(worker, outcome, out)))
        try:
            ended = await outcome.wait()
        finally:
            reading.cancel()
        watchdog = worker.watchdog
        # A loss: the output before it stays the result; the message is the error, said once.
        if isinstance(ended, Lost) or (watchdog is not None and watchdog.phase_of(msg_id) is Phase.KILLED):
            return await self._lose_worker(self._death_cause(worker), code, out.text)
        reply = ended.reply
        if reply is None and not await worker.is_alive():  # it said idle, and was ended before replying
            return await self._lose_worker(self._death_cause(worker), code, out.text)
        content = reply["content"] if reply else {}
        self._images = tuple(out.images)
        self._effects = effects_in((reply or {}).get("metadata"))  # the kernel's own report
        if content.get("status") == "ok":
            self._known_names = _names_from(content.get("user_expressions", {}).get("names"))
        return self._result(worker, msg_id, out, content)

    async def _read_cell(self, worker: AnyWorker, outcome: Outcome, out: CellOutput) -> None:
        """The cell's IOPub until idle, then its shell reply (None if none within
        ``namespace_timeout_ms`` of idle), handed to ``outcome``. A reply to an interrupted cell
        counts once its tree has gone quiet: a thread the cell left spinning keeps it running."""
        idle = False
        while not idle:
            msg = await worker.kc.get_iopub_msg(timeout=None)
            if msg["parent_header"].get("msg_id") == outcome.msg_id:
                idle = out.take(msg)
        try:
            bound_s = self.config.namespace_timeout_ms / 1000
            reply = await asyncio.wait_for(self._shell_reply(worker, outcome.msg_id), bound_s)
        except TimeoutError:
            reply = None
        outcome.reply(reply)

    def _result(self, worker: AnyWorker, msg_id: str, out: CellOutput, content: dict[str, Any]) -> RunResult:
        if worker.watchdog is not None and worker.watchdog.interrupted(msg_id):
            return error_result(out.text, names.INTERRUPTED_TEXT.format(deadline_ms=self.config.deadline_ms))
        if out.error is not None or content.get("status") == "error":
            error = out.error or f"{content.get('ename')}: {content.get('evalue')}"
            if is_refusal(error):  # the kernel's own check refused it before it ran
                return error_result(out.text, error, DONE_WITH_ERRORS)
            return error_result(out.text, error)
        if content.get("status") == "aborted":  # never ran: not an empty success
            return error_result(out.text, ABORTED_TEXT)
        return out.text

    def _with_notes(self, result: RunResult, worker: AnyWorker | None) -> RunResult:
        """Append the one-line notes a result carries: a memory soft-limit breach, a restart loop."""
        notes = [
            n
            for n in (worker.watchdog.take_soft_notice() if worker and worker.watchdog else None, self._restart_note)
            if n
        ]
        self._restart_note = None
        if not notes:
            return result
        text = "".join(f"{n}\n" for n in notes)
        if isinstance(result, str):
            return result + text
        result["result"] += text
        return result

    def _death_cause(self, worker: AnyWorker) -> str:
        """Why the worker is gone: the user's Esc, the watchdog's kill, or a crash."""
        if self._user_stop is not None:
            return self._user_stop
        if worker.retired:
            return f"stopped: {worker.retired}"
        watchdog = worker.watchdog
        if watchdog is not None and watchdog.loss is not None:
            return f"{watchdog.loss.cause}; {watchdog.loss.observer}"
        observer = f"; {watchdog.observer.describe()}" if watchdog else ""
        # The cgroup's OOM killer may end the kernel before the watchdog's thread sees why.
        if watchdog is not None and (cause := watchdog.cgroup_cause()) is not None:
            return f"{cause}{observer}"
        status = worker.exit_status()
        if status == names.DEADLINE_EXIT_STATUS:  # the supervisor's backstop
            return f"timeout: execution exceeded deadline_ms={self.config.deadline_ms}{observer}"
        return f"crash: {_exit_description(status)}{observer}"

    async def _shell_reply(self, worker: AnyWorker, msg_id: str) -> dict[str, Any]:
        while True:
            reply: dict[str, Any] = await worker.kc.get_shell_msg(timeout=None)
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply

    async def _lose_worker(self, cause: str, code: str | None = None, shown: str = "") -> dict[str, str]:
        """The worker is gone: ``error`` says why and which names were lost (the session's, and those
        ``code``, the call that was stopped, assigns); ``result`` is what the call ``shown`` before."""
        lost = list(self._known_names)
        self._known_names = []
        self._user_stop = None
        self._note_restart(cause)
        await self._release_worker()
        return error_result(shown, lost_names_message(cause, lost, assigned_names(code or "")))

    def _note_restart(self, cause: str) -> None:
        """From the third lost worker within 60 s, say so: something keeps killing it."""
        now = time.monotonic()
        self._restarts.append((now, cause))
        while self._restarts and now - self._restarts[0][0] > RESTART_WINDOW_S:
            self._restarts.popleft()
        if len(self._restarts) >= RESTART_WARNING_AT:
            self._restart_note = (
                f"[ivralo] this session's worker was lost {len(self._restarts)} times in the last "
                f"{RESTART_WINDOW_S:g} s; the last time: {cause}. Check the code for a loop that never "
                "ends or an allocation that grows, before retrying"
            )
            log.warning("ivralo: %s", self._restart_note)

    async def _give_back(self, worker: AnyWorker) -> None:
        await self._pool.release(worker)  # the pool that gave it: each takes back its own kind

    async def _release_worker(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            await self._give_back(worker)

    async def _fetch(self, call: NamespaceCall, name: str, *, tables_only: bool, or_repr: bool) -> Any:
        held = call.worker.held_segment()  # the exchange segment both sides hold from an earlier transfer
        if held is None:
            asked = f"{DATAPLANE}.prepare({name!r}, {tables_only}, {or_repr})"
        else:  # prepared and written in one request when the bytes fit it
            asked = f"{DATAPLANE}.prepare_into({name!r}, {tables_only}, {or_repr}, {held[0]!r}, {held[1]})"
        envelope = kernel_json(call.operation, await call.value(asked))
        if not isinstance(envelope, dict) or envelope.get("kind") not in ("json", "repr", "arrow", "npy"):
            raise TransferRefusedError(f"{call.operation}: the kernel's answer is not one of its data plane's")
        if held is None:
            envelope.pop("written", None)  # only ever read from the segment the host offered
        if envelope["kind"] in ("json", "repr"):
            return decode_inline(envelope, call.operation)
        if envelope["kind"] == "arrow":
            require_arrow(call.operation)
            self._pool.note_tables()
        cap, why = self._transfer_cap()
        # Shared memory on this machine; behind a gateway, binary buffers on the websocket.
        return await call.worker.fetch(call, envelope, cap, why)

    def _transfer_cap(self) -> tuple[int, str]:
        """(the most bytes one transfer from the kernel may take, where that number comes from)."""
        c = self.config
        cap = transfer_cap(c.transfer_cap_bytes, c.memory_limit_bytes)
        why = "transfer_cap_bytes" if c.transfer_cap_bytes is not None else "the kernel's memory limit"
        spare = available_memory() - c.host_memory_reserve_bytes
        if spare < cap:
            reserve = c.host_memory_reserve_bytes
            return max(0, spare), f"what the host has available less host_memory_reserve_bytes={reserve}"
        return cap, why

    def _history_recorder(self) -> HistoryRecorder | None:
        """The host's recorder of the worker's history (its provisioner's), if it has one here."""
        return self._worker.history_recorder() if self._worker is not None else None

    def _record_history(self) -> None:
        """What the worker's write guard copied, recorded now by its host (its provisioner's recorder
        also does, on a thread of its own, when a cell ends)."""
        recorder = self._history_recorder()
        if recorder is not None:
            recorder.record()

    @contextlib.asynccontextmanager
    async def _namespace(self, operation: str) -> AsyncIterator[NamespaceCall]:
        """One namespace operation, alone on the worker, bounded by ``namespace_timeout_ms`` (not lethal)."""
        async with self._lock:
            worker = await self._ensure_started()
            try:
                yield NamespaceCall(worker, operation, self.config.namespace_timeout_ms)
            except WorkerGone:
                pid = worker.pid
                lost = await self._lose_worker(self._death_cause(worker))
                raise NamespaceWorkerLostError(
                    f"{operation}: the worker pid={pid} ended during this call; {lost['error']}"
                ) from None


def _exit_description(code: int | None) -> str:
    if code is None:
        return "the kernel stopped answering"
    return f"the kernel {describe_exit(code)}"


def _names_from(expression_result: dict[str, Any] | None) -> list[str]:
    if not expression_result or expression_result.get("status") != "ok":
        return []
    try:
        value = ast.literal_eval(expression_result["data"]["text/plain"])
    except (KeyError, ValueError, SyntaxError):
        return []
    return [str(v) for v in value]
