"""[host] Everything that runs in the host process: the provisioner, the manager, the agent API.

The public names load on first use (PEP 562): a raw launch's host (``host.raw_launch``), started
for every VS Code kernel, imports a few small modules of this room and must not pay for the agent
API's (SQLAlchemy, httpx, the pool) on each start.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ivralo_kernel.protocol.platform_support import unsupported

if unsupported():  # Jupyter loads the provisioner from here: one sentence, not a failure deep inside
    raise ImportError(unsupported())

if TYPE_CHECKING:  # the same names as _WHERE, for type checkers (tests/test_host_api.py keeps them in step)
    from ivralo_kernel.host.attach import AttachError
    from ivralo_kernel.host.config import WorkerConfig
    from ivralo_kernel.host.dataplane import ArrowMissingError, TransferRefusedError, UnsupportedValueError
    from ivralo_kernel.host.gateway_client import GatewayError
    from ivralo_kernel.host.history_store import HistoryError, NewerChangeError
    from ivralo_kernel.host.interpreters import InterpreterError
    from ivralo_kernel.host.manager import IvraloKernelManager
    from ivralo_kernel.host.namespace import NamespaceTimeoutError, NamespaceWorkerLostError
    from ivralo_kernel.host.pool import HostMemoryError, WorkerPool, WorkerPoolExhaustedError
    from ivralo_kernel.host.provisioner import IvraloProvisioner
    from ivralo_kernel.host.session import Session
    from ivralo_kernel.host.sync_session import SyncSession
    from ivralo_kernel.protocol import ConfigError, IvraloError, WorkerBootstrapError

# name -> the module that defines it; __all__ lists the same names (tests/test_host_api.py pins them).
_WHERE = {
    "ArrowMissingError": "ivralo_kernel.host.dataplane",
    "AttachError": "ivralo_kernel.host.attach",
    "ConfigError": "ivralo_kernel.protocol",
    "GatewayError": "ivralo_kernel.host.gateway_client",
    "HistoryError": "ivralo_kernel.host.history_store",
    "HostMemoryError": "ivralo_kernel.host.pool",
    "InterpreterError": "ivralo_kernel.host.interpreters",
    "IvraloError": "ivralo_kernel.protocol",
    "IvraloKernelManager": "ivralo_kernel.host.manager",
    "IvraloProvisioner": "ivralo_kernel.host.provisioner",
    "NamespaceTimeoutError": "ivralo_kernel.host.namespace",
    "NamespaceWorkerLostError": "ivralo_kernel.host.namespace",
    "NewerChangeError": "ivralo_kernel.host.history_store",
    "Session": "ivralo_kernel.host.session",
    "SyncSession": "ivralo_kernel.host.sync_session",
    "TransferRefusedError": "ivralo_kernel.host.dataplane",
    "UnsupportedValueError": "ivralo_kernel.host.dataplane",
    "WorkerBootstrapError": "ivralo_kernel.protocol",
    "WorkerConfig": "ivralo_kernel.host.config",
    "WorkerPool": "ivralo_kernel.host.pool",
    "WorkerPoolExhaustedError": "ivralo_kernel.host.pool",
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
