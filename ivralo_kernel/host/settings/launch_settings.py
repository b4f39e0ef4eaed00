"""[host] The settings a kernel launched without a host reads: which ``IVRALO_*`` variable carries each.

The kernelspec writes them into kernel.json's ``env`` and ``raw_launch_settings`` collects them from
the settings files, so a raw launch (VS Code runs kernel.json's argv itself) gets the same policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ivralo_kernel.protocol import names

__all__ = ["RAW_LAUNCH_ENV", "raw_launch_env"]

RAW_LAUNCH_ENV = {
    "sandbox": names.ENV_SANDBOX_SETTING,
    "role": names.ENV_ROLE,
    "audience": names.ENV_AUDIENCE,
    "deadline_ms": names.ENV_DEADLINE_MS,
    "interrupt_grace_ms": names.ENV_INTERRUPT_GRACE_MS,
    "memory_limit_bytes": names.ENV_MEMORY_LIMIT,
    "rlimit_nofile": names.ENV_RLIMIT_NOFILE,
    "history_cap_bytes": names.ENV_HISTORY_CAP,
    "history_cap_count": names.ENV_HISTORY_CAP_COUNT,
    "landlock": names.ENV_LANDLOCK,
    "landlock_network": names.ENV_LANDLOCK_NETWORK,
    "surface": names.ENV_SURFACE,
    "code_gate": names.ENV_CODE_GATE,
    "devices": names.ENV_DEVICES,
    "code_gate_modules": names.ENV_CODE_GATE_MODULES,
    "code_gate_denied_names": names.ENV_CODE_GATE_DENIED_NAMES,
    "code_gate_denied_attributes": names.ENV_CODE_GATE_DENIED_ATTRIBUTES,
    "code_gate_denied_calls": names.ENV_CODE_GATE_DENIED_CALLS,
}


def raw_launch_env(settings: Mapping[str, Any]) -> dict[str, str]:
    """The ``IVRALO_*`` variables that carry ``settings`` to a kernel launched without a host."""
    env = {}
    for name, var in RAW_LAUNCH_ENV.items():
        value = settings.get(name)
        if value is None:
            continue
        if isinstance(value, bool):
            env[var] = "on" if value else "off"
        elif isinstance(value, (list, tuple)):  # module and attribute names hold no comma
            env[var] = ",".join(map(str, value))
        else:
            env[var] = str(value)
    return env
