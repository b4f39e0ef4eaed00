"""[protocol] The launch policy a host hands to a kernel: a frozen value object and its JSON form.

The provisioner writes it to a read-only file and names the file in ``IVRALO_POLICY_FILE``. A
kernel launched without a host (VS Code runs ``kernel.json`` argv itself) builds it from the
``IVRALO_*`` variables of the kernelspec's ``env`` instead, so both paths apply the same limits.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import ivralo_kernel.protocol.names as names  # the module, not this package (which imports this one)
from ivralo_kernel.protocol.audience import AUDIENCES
from ivralo_kernel.protocol.code_gate import GateRules
from ivralo_kernel.protocol.errors import ConfigError
from ivralo_kernel.protocol.sandbox import devices

GIB = 1 << 30


def default_memory_limit() -> int:
    """Half the machine's memory, at least 1 GiB: a runaway cell fails with MemoryError long
    before the host starts swapping or the OOM killer picks a victim."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):  # pragma: no cover - non-POSIX
        return 4 * GIB
    return max(GIB, total // 2)


@dataclass(frozen=True)
class KernelPolicy:
    """What a kernel enforces on itself. ``None`` for a limit means "leave the inherited one"."""

    workspace: str
    role: str = names.ROLE_SPECIALIST
    memory_limit_bytes: int | None = None
    rlimit_nofile: int | None = None
    # Per-execution deadline. When the host's watchdog enforces it, the kernel's own stays off;
    # a kernel started without our host (VS Code) enforces it itself.
    deadline_ms: int | None = None
    interrupt_grace_ms: int = 2_000
    host_enforces_deadline: bool = False
    # None: the kernel reads the trust store itself (a launch without our host).
    trusted: bool | None = None
    history_cap_bytes: int = 256 << 20
    history_cap_count: int = 1000
    landlock: bool = True  # the OS-enforced write floor, where the Linux kernel has it
    # The TCP connect floor (Landlock ABI >= 4): ports of the allowed hosts only. Part of the same
    # Landlock layer, so it is off whenever ``landlock`` is. Off unless asked for: a floor that knows
    # ports and not addresses refuses the kernel's own loopback links (a forked child's output, the
    # debugger, a local cluster), whose ports are picked at run time, and every host allowed later.
    landlock_network: bool = False
    # Absolute paths the kernel may not read (credential stores); None: the default list.
    credential_stores: tuple[str, ...] | None = None
    # Without a sandbox: trees the kernel's tree may read besides the default list
    # (protocol/sandbox/fallback_reads.py); None: reads are not restricted.
    fallback_reads: tuple[str, ...] | None = ()
    # Who reads the refusals (protocol.audience): a person at a notebook, or an agent's tool.
    audience: str = "person"
    # The project surface (the interpreter's packages), or the hermetic one (names.SURFACES).
    surface: str = names.SURFACE_PROJECT
    # The static code gate's rules, checked on each cell before it runs; None: no gate.
    code_gate: GateRules | None = None
    # Device paths passed through (GPUs: protocol/sandbox/devices.py), resolved by the host.
    devices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.surface not in names.SURFACES:
            raise ConfigError(
                "surface", f"{self.surface!r} is not a surface", f"Use one of: {', '.join(names.SURFACES)}"
            )
        if self.audience not in AUDIENCES:
            raise ConfigError(
                "audience", f"{self.audience!r} is not an audience", f"Use one of: {', '.join(AUDIENCES)}"
            )
        if self.role not in names.ROLES:
            raise ConfigError("role", f"{self.role!r} is not a role", f"Use one of: {', '.join(names.ROLES)}")
        for field in (
            "memory_limit_bytes",
            "rlimit_nofile",
            "deadline_ms",
            "interrupt_grace_ms",
            "history_cap_bytes",
            "history_cap_count",
        ):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ConfigError(field, f"{value!r} is not a positive whole number", "Give a count, or leave it unset")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> KernelPolicy:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ConfigError("policy", "the policy file does not hold an object", "Let the host write it")
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        for listed in ("credential_stores", "fallback_reads", "devices"):
            if isinstance(known.get(listed), list):
                known[listed] = tuple(known[listed])
        if isinstance(known.get("code_gate"), dict):
            known["code_gate"] = GateRules.from_dict(known["code_gate"])
        return cls(**known)

    @classmethod
    def from_env(cls, env: Mapping[str, str], cwd: str) -> KernelPolicy:
        """The policy file named by the environment, else the ``IVRALO_*`` variables, else defaults."""
        path = env.get(names.ENV_POLICY_FILE)
        if path:
            with open(path, encoding="utf-8") as f:
                return cls.from_json(f.read())
        fields: dict[str, Any] = {"workspace": env.get(names.ENV_WORKSPACE) or cwd}
        if env.get(names.ENV_LANDLOCK, "").lower() in ("0", "off", "false", "no"):
            fields["landlock"] = False
        if env.get(names.ENV_LANDLOCK_NETWORK, "").lower() in ("1", "on", "true", "yes"):
            fields["landlock_network"] = True
        if env.get(names.ENV_HOST_ENFORCES_DEADLINE) == "1":
            fields["host_enforces_deadline"] = True
        if env.get(names.ENV_ROLE):
            fields["role"] = env[names.ENV_ROLE]
        if env.get(names.ENV_AUDIENCE):
            fields["audience"] = env[names.ENV_AUDIENCE]
        listed = env.get(names.ENV_DEVICES) or devices.AUTO
        wanted = [listed] if listed in (devices.AUTO, devices.NONE) else listed.split(",")
        why = devices.check_setting(wanted)
        if why is not None:
            raise ConfigError(names.ENV_DEVICES, why, "Give auto, none, or device paths separated by commas")
        fields["devices"] = devices.resolve(wanted)[0]
        if env.get(names.ENV_SURFACE):
            fields["surface"] = env[names.ENV_SURFACE]
        if env.get(names.ENV_CODE_GATE, "").lower() in ("1", "on", "true", "yes"):
            fields["code_gate"] = _gate_from_env(env)
        for var, field in (
            (names.ENV_MEMORY_LIMIT, "memory_limit_bytes"),
            (names.ENV_RLIMIT_NOFILE, "rlimit_nofile"),
            (names.ENV_DEADLINE_MS, "deadline_ms"),
            (names.ENV_INTERRUPT_GRACE_MS, "interrupt_grace_ms"),
            (names.ENV_HISTORY_CAP, "history_cap_bytes"),
            (names.ENV_HISTORY_CAP_COUNT, "history_cap_count"),
        ):
            raw = env.get(var)
            if raw:
                try:
                    fields[field] = int(raw)
                except ValueError:
                    raise ConfigError(var, f"{raw!r} is not a whole number", "Set it to a byte or file count") from None
        return cls(**fields)


def _gate_from_env(env: Mapping[str, str]) -> GateRules:
    """The gate's rules from a raw launch's variables; a list not given keeps its default."""
    given: dict[str, object] = {}
    for var, field in (
        (names.ENV_CODE_GATE_MODULES, "modules"),
        (names.ENV_CODE_GATE_DENIED_NAMES, "denied_names"),
        (names.ENV_CODE_GATE_DENIED_ATTRIBUTES, "denied_attributes"),
        (names.ENV_CODE_GATE_DENIED_CALLS, "denied_calls"),
    ):
        if var in env:
            given[field] = [item.strip() for item in env[var].split(",") if item.strip()]
    return GateRules.from_dict(given)
