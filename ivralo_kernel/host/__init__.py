"""[host] Everything that runs in the host process: the provisioner, the manager, the agent API.

The public names load on first use (PEP 562): a raw launch's host (``host.raw_launch``), started
for every VS Code kernel, imports a few small modules of this room and must not pay for the agent
API's (SQLAlchemy, the pool) on each start.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ivralo_kernel.protocol.sandbox.platform_support import unsupported

if unsupported():  # Jupyter loads the provisioner from here: one sentence, not a failure deep inside
    raise ImportError(unsupported())

if TYPE_CHECKING:  # the same names as _WHERE, for type checkers (tests/test_host_api.py keeps them in step)
    from ivralo_kernel.host.agent.attach import AttachError
    from ivralo_kernel.host.agent.dataplane import ArrowMissingError, TransferRefusedError, UnsupportedValueError
    from ivralo_kernel.host.agent.gateway.client import GatewayError
    from ivralo_kernel.host.agent.namespace import NamespaceTimeoutError, NamespaceWorkerLostError
    from ivralo_kernel.host.agent.pool import HostMemoryError, WorkerPool, WorkerPoolExhaustedError
    from ivralo_kernel.host.agent.session import Session
    from ivralo_kernel.host.agent.sync_session import SyncSession
    from ivralo_kernel.host.history.store import HistoryError, NewerChangeError
    from ivralo_kernel.host.jupyter.interpreters import InterpreterError
    from ivralo_kernel.host.jupyter.manager import IvraloKernelManager
    from ivralo_kernel.host.jupyter.provisioner import IvraloProvisioner
    from ivralo_kernel.host.settings.config import WorkerConfig
    from ivralo_kernel.protocol import ConfigError, IvraloError, WorkerBootstrapError

# name -> the module that defines it; __all__ lists the same names (tests/test_host_api.py pins them).
_WHERE = {
    "ArrowMissingError": "ivralo_kernel.host.agent.dataplane",
    "AttachError": "ivralo_kernel.host.agent.attach",
    "ConfigError": "ivralo_kernel.protocol",
    "GatewayError": "ivralo_kernel.host.agent.gateway.client",
    "HistoryError": "ivralo_kernel.host.history.store",
    "HostMemoryError": "ivralo_kernel.host.agent.pool",
    "InterpreterError": "ivralo_kernel.host.jupyter.interpreters",
    "IvraloError": "ivralo_kernel.protocol",
    "IvraloKernelManager": "ivralo_kernel.host.jupyter.manager",
    "IvraloProvisioner": "ivralo_kernel.host.jupyter.provisioner",
    "NamespaceTimeoutError": "ivralo_kernel.host.agent.namespace",
    "NamespaceWorkerLostError": "ivralo_kernel.host.agent.namespace",
    "NewerChangeError": "ivralo_kernel.host.history.store",
    "Session": "ivralo_kernel.host.agent.session",
    "SyncSession": "ivralo_kernel.host.agent.sync_session",
    "TransferRefusedError": "ivralo_kernel.host.agent.dataplane",
    "UnsupportedValueError": "ivralo_kernel.host.agent.dataplane",
    "WorkerBootstrapError": "ivralo_kernel.protocol",
    "WorkerConfig": "ivralo_kernel.host.settings.config",
    "WorkerPool": "ivralo_kernel.host.agent.pool",
    "WorkerPoolExhaustedError": "ivralo_kernel.host.agent.pool",
}
__all__ = [
    "ArrowMissingError",
    "AttachError",
    "ConfigError",
    "GatewayError",
    "HistoryError",
    "HostMemoryError",
    "InterpreterError",
    "IvraloError",
    "IvraloKernelManager",
    "IvraloProvisioner",
    "NamespaceTimeoutError",
    "NamespaceWorkerLostError",
    "NewerChangeError",
    "Session",
    "SyncSession",
    "TransferRefusedError",
    "UnsupportedValueError",
    "WorkerBootstrapError",
    "WorkerConfig",
    "WorkerPool",
    "WorkerPoolExhaustedError",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'ivralo_kernel.host' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
