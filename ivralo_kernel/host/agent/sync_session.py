"""[host] ``SyncSession``: ``Session`` for scripts, each call blocking until it is done.

It runs a ``Session`` on an event loop of its own, on a thread (``blocking.LoopThread``);
tests/test_host_api.py keeps its members in step with ``Session``'s.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from ivralo_kernel.host.agent.blocking import LoopThread
from ivralo_kernel.host.agent.kernel_worker import DeadlineView
from ivralo_kernel.host.agent.pool import WorkerPool
from ivralo_kernel.host.agent.session_calls import (
    RunResult,
)
from ivralo_kernel.host.settings.config import WorkerConfig

if TYPE_CHECKING:
    from ivralo_kernel.host.agent.attach import SyncAttachedSession

from ivralo_kernel.host.agent.session import Session

__all__ = ["SyncSession"]
T = TypeVar("T")


class SyncSession:
    """The same session for scripts: every method and property of ``Session``, each call blocking
    until it is done (``with SyncSession(workspace) as s: s.run(code)``). Its parameters are
    ``Session``'s. It runs its own event loop on a thread (tests/test_host_api.py keeps the two in step).
    """

    def __init__(
        self,
        workspace: str | os.PathLike[str] | None = None,
        *,
        config: WorkerConfig | None = None,
        role: str | None = None,
        grants: tuple[str, ...] = (),
        ask: Callable[[str, tuple[str, ...]], Awaitable[str]] | None = None,
        approve: Callable[[str], Awaitable[bool]] | None = None,
        surface: str | None = None,
        gateway_url: str | None = None,
        python: str | None = None,
        project: str | os.PathLike[str] | None = None,
        pool: WorkerPool | None = None,
    ) -> None:
        self._loop = LoopThread("ivralo-session")
        given: dict[str, Any] = dict(config=config, role=role, grants=grants, ask=ask, approve=approve)
        given.update(surface=surface)
        given.update(gateway_url=gateway_url, python=python, project=project, pool=pool)
        self._session: Session = self._call(_make_session(workspace, **given))

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.call(coro)

    def __enter__(self) -> SyncSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def connect(connection_file: str, timeout_s: float | None = None) -> SyncAttachedSession:
        """``Session.connect``, blocking: ``with SyncSession.connect(path) as s: s.run(code)``."""
        from ivralo_kernel.host.agent.attach import SyncAttachedSession

        return SyncAttachedSession(connection_file, timeout_s)

    @property
    def workspace(self) -> str:
        """The folder the kernel works in (absolute)."""
        return self._session.workspace

    @property
    def config(self) -> WorkerConfig:
        """The settings the session's kernels run with."""
        return self._session.config

    @property
    def role(self) -> str:
        """The role the session's kernels run as (what they may do)."""
        return self._session.role

    @property
    def grants(self) -> tuple[str, ...]:
        """The brokered operations' grants given to this session."""
        return self._session.grants

    @property
    def ask(self) -> Callable[[str, tuple[str, ...]], Awaitable[str]] | None:
        """The callback that answers the egress question, or None."""
        return self._session.ask

    @property
    def approve(self) -> Callable[[str], Awaitable[bool]] | None:
        """The callback that approves each cell before it runs, or None."""
        return self._session.approve

    @property
    def surface(self) -> str:
        """The surface the session's kernels offer ("project" or "hermetic")."""
        return str(self._session.surface)

    @property
    def gateway_url(self) -> str | None:
        """The Kernel Gateway the kernels run on, or None (on this machine)."""
        return self._session.gateway_url

    @property
    def kernel_info(self) -> dict[str, Any]:
        """``Session.kernel_info``."""
        return self._session.kernel_info

    @property
    def memory_cgroup_report(self) -> str:
        """``Session.memory_cgroup_report``."""
        return self._session.memory_cgroup_report

    @property
    def pid(self) -> int | None:
        """``Session.pid``."""
        return self._session.pid

    @property
    def supervisor_pid(self) -> int | None:
        """``Session.supervisor_pid``."""
        return self._session.supervisor_pid

    @property
    def watchdog(self) -> DeadlineView | None:
        """``Session.watchdog``."""
        return self._session.watchdog

    def run(self, code: str) -> RunResult:
        """``Session.run``, blocking."""
        return self._call(self._session.run(code))

    def run_tests(self, path: str = ".", runner: str | None = None, args: tuple[str, ...] = ()) -> dict[str, Any]:
        """``Session.run_tests``, blocking."""
        return self._call(self._session.run_tests(path, runner, args))

    def interpreter(self) -> str:
        """``Session.interpreter``, blocking."""
        return self._call(self._session.interpreter())

    def list_vars(self) -> list[str]:
        """``Session.list_vars``, blocking."""
        return self._call(self._session.list_vars())

    def get_var(self, name: str, *, or_repr: bool = False) -> Any:
        """``Session.get_var``, blocking."""
        return self._call(self._session.get_var(name, or_repr=or_repr))

    def get_dataframe(self, name: str) -> Any:
        """``Session.get_dataframe``, blocking."""
        return self._call(self._session.get_dataframe(name))

    def inject_dataframe(self, name: str, frame: Any) -> None:
        """``Session.inject_dataframe``, blocking."""
        self._call(self._session.inject_dataframe(name, frame))

    def set_var(self, name: str, value: Any) -> None:
        """``Session.set_var``, blocking."""
        self._call(self._session.set_var(name, value))

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """``Session.snapshot``, blocking."""
        return self._call(self._session.snapshot())

    def apropos(self, word: str) -> str:
        """``Session.apropos``, blocking."""
        return self._call(self._session.apropos(word))

    def doc(self, name: str) -> str:
        """``Session.doc``, blocking."""
        return self._call(self._session.doc(name))

    def reset(self) -> None:
        """``Session.reset``, blocking."""
        self._call(self._session.reset())

    def interrupt(self) -> dict[str, str] | None:
        """``Session.interrupt``, blocking."""
        return self._call(self._session.interrupt())

    def restart(self) -> dict[str, str] | None:
        """``Session.restart``, blocking."""
        return self._call(self._session.restart())

    def history(self, path: str | None = None) -> list[dict[str, Any]]:
        """``Session.history``, blocking."""
        return self._call(self._session.history(path))

    def restore(self, target: str, *, at: str | None = None, force: bool = False) -> dict[str, Any]:
        """``Session.restore``, blocking."""
        return self._call(self._session.restore(target, at=at, force=force))

    def close(self) -> None:
        """``Session.close``, blocking; then the session's own loop ends. Calling it again does nothing."""
        if self._loop.stopped:
            return
        self._call(self._session.close())
        self._loop.stop()


async def _make_session(workspace: str | os.PathLike[str] | None, **kwargs: Any) -> Session:
    return Session(workspace, **kwargs)  # built inside the loop thread: its lock binds to that loop
