"""[host] ``WorkerConfig``: every knob of a worker, validated when it is built.

An invalid combination raises ``ConfigError`` naming the field and the fix, at construction, not
at the first call that would have misbehaved.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ivralo_kernel.protocol import ConfigError
from ivralo_kernel.protocol.names import SANDBOX_MODES

GIB = 1 << 30
_FLAGS = ("interrupt_before_kill", "landlock_network")  # True or False, nothing else


@dataclass(frozen=True)
class WorkerConfig:
    deadline_ms: int = 60_000
    interrupt_before_kill: bool = True
    interrupt_grace_ms: int = 2_000
    bootstrap_timeout_ms: int = 60_000
    namespace_timeout_ms: int = 10_000
    memory_limit_bytes: int | None = None  # RLIMIT_DATA; None: half the machine's memory
    memory_soft_limit_bytes: int | None = 4 * GIB
    memory_hard_limit_bytes: int | None = None
    host_memory_reserve_bytes: int = 512 * (1 << 20)
    rlimit_nofile: int | None = None
    max_workers: int = 8
    prewarm_pool_size: int = 0
    idle_ttl_seconds: float = 1800.0
    observer_poll_ms: int = 500
    stall_window_ms: int = 5_000
    # The Landlock TCP floor: subprocesses and native code connect only to the allowed hosts' ports.
    # Off by default: it also refuses the kernel's own loopback links (debugger, forked children).
    landlock_network: bool = False
    # The OS sandbox (bubblewrap): "auto" where it can be built, "required", or "off" (see
    # IvraloProvisioner.sandbox).
    sandbox: str = "auto"

    def __post_init__(self) -> None:
        if self.sandbox not in SANDBOX_MODES:
            raise ConfigError(
                "sandbox", f"{self.sandbox!r} is not one of {', '.join(SANDBOX_MODES)}", "Pick one of them"
            )
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "sandbox":
                continue
            if f.name in _FLAGS:
                if not isinstance(value, bool):
                    raise ConfigError(f.name, f"{value!r} is not True or False", "Pass a bool")
                continue
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f.name, f"{value!r} is not a number", "Pass a number")
            minimum = 0 if f.name in ("prewarm_pool_size", "host_memory_reserve_bytes") else 1
            if value < minimum:
                raise ConfigError(f.name, f"{value!r} is below {minimum}", f"Use a value of at least {minimum}")
        if self.interrupt_before_kill and self.interrupt_grace_ms >= self.deadline_ms:
            raise ConfigError(
                "interrupt_grace_ms",
                f"{self.interrupt_grace_ms} is not below deadline_ms={self.deadline_ms}",
                "Make the grace after an interrupt shorter than the deadline itself",
            )
        soft, hard = self.memory_soft_limit_bytes, self.memory_hard_limit_bytes
        if soft is not None and hard is not None and soft > hard:
            raise ConfigError(
                "memory_soft_limit_bytes",
                f"{soft} is above memory_hard_limit_bytes={hard}",
                "The soft limit warns before the hard limit kills: make it the smaller one",
            )
        if self.prewarm_pool_size > self.max_workers:
            raise ConfigError(
                "prewarm_pool_size",
                f"{self.prewarm_pool_size} is above max_workers={self.max_workers}",
                "Prewarm at most max_workers spares",
            )
