"""[guards] What the kernel process enforces on itself, installed before ipykernel is imported.

Decisions are pure functions; the modules that change process state say so in their docstring.
"""

from ivralo_kernel.guards.environ import scrub_environ
from ivralo_kernel.guards.limits import AppliedLimits, apply_limits

__all__ = ["AppliedLimits", "apply_limits", "scrub_environ"]
