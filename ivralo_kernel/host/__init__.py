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

if TYPE_CHECKING:
    from ivralo_kernel.host.config import WorkerConfig
    from ivralo_kernel.host.dataplane import ArrowMissingError, TransferRefusedError, UnsupportedValueError
    from ivralo_kernel.host.manager import IvraloKernelManager
    from ivralo_kernel.host.namespace import NamespaceTimeoutError, NamespaceWorkerLostError
    from ivralo_kernel.host.pool import HostMemoryError, WorkerPool, WorkerPoolExhaustedError
    from ivralo_kernel.host.provisioner import IvraloProvisioner
    from ivralo_kernel.host.session import Session, SyncSession
    from ivralo_kernel.protocol import ConfigError, WorkerBootstrapError

_WHERE = {
    "ArrowMissingError": "ivralo_kernel.host.dataplane",
    "NamespaceTimeoutError": "ivralo_kernel.host.namespace",
    "NamespaceWorkerLostError": "ivralo_kernel.host.namespace",
    "TransferRefusedError": "ivralo_kernel.host.dataplane",
    "UnsupportedValueError": "ivralo_kernel.host.dataplane",
    "ConfigError": "ivralo_kernel.protocol",
    "HostMemoryError": "ivralo_kernel.host.pool",
    "IvraloKernelManager": "ivralo_kernel.host.manager",
    "IvraloProvisioner": "ivralo_kernel.host.provisioner",
    "Session": "ivralo_kernel.host.session",
    "SyncSession": "ivralo_kernel.host.session",
    "WorkerBootstrapError": "ivralo_kernel.protocol",
    "WorkerConfig": "ivralo_kernel.host.config",
    "WorkerPool": "ivralo_kernel.host.pool",
    "WorkerPoolExhaustedError": "ivralo_kernel.host.pool",
}
__all__ = [
    "ArrowMissingError",
    "ConfigError",
    "HostMemoryError",
    "IvraloKernelManager",
    "IvraloProvisioner",
    "NamespaceTimeoutError",
    "NamespaceWorkerLostError",
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
