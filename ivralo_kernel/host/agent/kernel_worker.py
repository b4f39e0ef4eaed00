"""[host] ``KernelWorker``: what ``Session`` and the namespace calls use of a kernel, local or remote.

Two implementations: ``Worker`` (host/agent/worker.py, a kernel this host started, with its provisioner's
watchdog) and ``GatewayWorker`` (host/agent/gateway/worker.py, a kernel a Jupyter Kernel Gateway runs). Session
is written against this protocol alone, so it never asks which one it holds, and the gateway and
the namespace calls meet here instead of importing each other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import subprocess

    from ivralo_kernel.host.broker.responder import BrokerResponder
    from ivralo_kernel.host.history.ledger import HistoryRecorder
    from ivralo_kernel.host.watch.escalation import Phase
    from ivralo_kernel.host.watch.outcome import Outcome
    from ivralo_kernel.host.watch.watchdog import Watchdog

Asker = Callable[[str, tuple[str, ...]], Awaitable[str]]


class KernelClient(Protocol):
    """The calls made of jupyter_client's ``AsyncKernelClient`` (or the gateway's websocket)."""

    def execute(
        self,
        code: str,
        silent: bool = False,
        store_history: bool = True,
        user_expressions: dict[str, str] | None = None,
        allow_stdin: bool | None = None,
        stop_on_error: bool = True,
    ) -> str: ...

    async def get_iopub_msg(self, timeout: float | None = None) -> dict[str, Any]: ...

    async def get_shell_msg(self, timeout: float | None = None) -> dict[str, Any]: ...


class TreeObserver(Protocol):
    def describe(self) -> str: ...


class LossReport(Protocol):
    @property
    def cause(self) -> str: ...

    @property
    def observer(self) -> str: ...


class DeadlineView(Protocol):
    """What a caller reads of the deadline's watcher: the local ``Watchdog`` or ``RemoteDeadline``."""

    @property
    def observer(self) -> TreeObserver: ...

    @property
    def loss(self) -> LossReport | None: ...

    def interrupted(self, msg_id: str) -> bool: ...

    def phase_of(self, msg_id: str) -> Phase | None: ...

    def take_soft_notice(self) -> str | None: ...

    def cgroup_cause(self) -> str | None: ...


class Transfer(Protocol):
    """One namespace operation, as the data plane's remote path uses it (``NamespaceCall``)."""

    operation: str

    async def value(self, expression: str) -> str: ...

    def left_s(self) -> float: ...

    def timeout(self) -> Exception: ...


class KernelWorker(Protocol):
    """One started, ready kernel, as a session uses it."""

    kernel_info: dict[str, Any]
    last_used: float
    busy: bool
    retired: str | None

    @property
    def kc(self) -> KernelClient: ...

    @property
    def pid(self) -> int | None: ...

    @property
    def supervisor_pid(self) -> int | None: ...

    @property
    def watchdog(self) -> DeadlineView | None: ...

    def exit_status(self) -> int | None: ...

    async def is_alive(self) -> bool: ...

    async def kill(self) -> None: ...

    async def stop(self) -> None: ...

    def outcome(self, msg_id: str) -> Outcome:
        """How execution ``msg_id`` ends (its reply, or the kernel's loss): one future, resolved once."""
        ...

    def take_session(self, grants: frozenset[str], ask: Asker | None, on_asking: Callable[[bool], None]) -> None:
        """A session's grants and its ``ask`` (None: nobody to ask) now apply to this kernel's questions;
        ``on_asking(True/False)`` brackets each question."""
        ...

    def history_recorder(self) -> HistoryRecorder | None:
        """The host's recorder of the kernel's history, where the host keeps one."""
        ...

    def held_segment(self) -> tuple[str, int] | None:
        """(path, capacity) of the exchange segment the host and the kernel hold from an earlier
        transfer, which the kernel may write into while it prepares (``prepare_into``); else None."""
        ...

    async def fetch(self, call: Transfer, envelope: dict[str, Any], cap: int, why: str) -> Any:
        """Step two of ``get_var``/``get_dataframe``: the prepared bytes, checked against ``cap``
        (already in the held segment when the envelope says ``written``)."""
        ...

    async def inject(self, call: Transfer, name: str, table: Any, kind: str, size: int) -> None:
        """``inject_dataframe``'s bytes to the kernel, bound there as ``name``."""
        ...


class KernelHost(Protocol):
    """What a local ``Worker`` uses of its kernel's provisioner (``IvraloProvisioner``), typed here so
    that the worker need not import the provisioner (which the kernel manager loads by entry point)."""

    watchdog: Watchdog | None
    broker: BrokerResponder | None
    history_recorder: HistoryRecorder | None
    exchange_dir: str | None
    process: subprocess.Popen[bytes] | None

    def host_pid(self, kernel_pid: int) -> int: ...

    def supervisor_pid(self) -> int | None: ...

    def set_broker_grants(self, grants: frozenset[str]) -> None: ...

    async def kill(self, restart: bool = False) -> None: ...
