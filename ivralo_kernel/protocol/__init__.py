"""[protocol] The contract between rooms: names, the launch policy, the secret rule, the errors.

Pure data and stdlib only, so the supervisor, the kernel and the host can all import it.
"""

from ivralo_kernel.protocol import names
from ivralo_kernel.protocol.credentials import database_env_names, is_secret_name, scrub
from ivralo_kernel.protocol.errors import (
    ConfigError,
    GuardRefusal,
    HermeticImportError,
    IvraloError,
    KernelSpecError,
    SecurityError,
    TrustGateError,
    WorkerBootstrapError,
)
from ivralo_kernel.protocol.policy import KernelPolicy, default_memory_limit

__all__ = [
    "ConfigError",
    "GuardRefusal",
    "HermeticImportError",
    "IvraloError",
    "KernelPolicy",
    "KernelSpecError",
    "SecurityError",
    "TrustGateError",
    "WorkerBootstrapError",
    "database_env_names",
    "default_memory_limit",
    "is_secret_name",
    "names",
    "scrub",
]
