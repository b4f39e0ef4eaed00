"""[host] Everything that runs in the host process: the provisioner, the manager, the agent API."""

from ivralo_kernel.host.config import WorkerConfig
from ivralo_kernel.host.manager import IvraloKernelManager
from ivralo_kernel.host.pool import HostMemoryError, WorkerPool, WorkerPoolExhaustedError
from ivralo_kernel.host.provisioner import IvraloProvisioner
from ivralo_kernel.host.session import Session, SyncSession
from ivralo_kernel.protocol import ConfigError, WorkerBootstrapError

__all__ = [
    "ConfigError",
    "HostMemoryError",
    "IvraloKernelManager",
    "IvraloProvisioner",
    "Session",
    "SyncSession",
    "WorkerBootstrapError",
    "WorkerConfig",
    "WorkerPool",
    "WorkerPoolExhaustedError",
]
