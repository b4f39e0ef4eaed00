"""[kernel] What the launcher did before ipykernel existed, for ``kernel_info_reply`` to report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ivralo_kernel.guards._hooks import FileGuard
    from ivralo_kernel.guards.network import NetworkGuard
    from ivralo_kernel.kernel.stages import SupervisorPipe
    from ivralo_kernel.protocol import KernelPolicy


@dataclass
class LaunchState:
    workspace: str = ""
    role: str = "specialist"
    started_at: float = 0.0  # wall clock at which the host/supervisor launched us
    bootstrap_ms: float | None = None
    layers: dict[str, Any] = field(default_factory=dict)
    scrubbed: list[str] = field(default_factory=list)  # names only, never values
    notes: list[str] = field(default_factory=list)  # things the person should know (banner)
    policy: KernelPolicy | None = None
    pipe: SupervisorPipe | None = None
    network: NetworkGuard | None = None
    files: FileGuard | None = None
    # Ports the Landlock TCP floor lets this kernel's tree connect to; None: no floor in force.
    tcp_floor: tuple[int, ...] | None = None


STATE = LaunchState()
