"""[host] The one settings model: every ivralo setting is a trait here, with its help, its default and
its bounds, and ``None`` is the only way to say "unset".

Three config sections, from the widest to the narrowest (traitlets applies them in that order):

- ``IvraloSettings``: every kernel, whoever starts it;
- ``IvraloProvisioner``: kernels that Jupyter's hosts start (JupyterLab, ``jupyter console``, nbclient,
  VS Code, ``ivralo-kernel run``), and, since an agent's kernel is started by the same provisioner,
  agents too;
- ``IvraloAgent``: kernels of the agent API (``Session``, ``WorkerPool``, ``ivralo-kernel doctor``), whose
  defaults follow the worker reference (a 60 s deadline, a 4 GiB soft memory limit).

Where their values come from, and which wins, is ``host/settings/resolve.py`` (which names these classes too).
"""

from __future__ import annotations

from typing import Any

from traitlets import Bool, Enum, Float, Int, List, Unicode, default
from traitlets.config import Configurable

from ivralo_kernel.protocol import ConfigError, names
from ivralo_kernel.protocol.audience import AGENT, AUDIENCES, PERSON
from ivralo_kernel.protocol.code_gate import (
    DEFAULT_DENIED_ATTRIBUTES,
    DEFAULT_DENIED_CALLS,
    DEFAULT_DENIED_NAMES,
    DEFAULT_MODULES,
    REACHES_OUTSIDE,
    STDLIB,
    GateRules,
)
from ivralo_kernel.protocol.credentials import CREDENTIAL_STORES
from ivralo_kernel.protocol.sandbox import devices
from ivralo_kernel.protocol.sandbox.closed_names import TOOL_FILES_DEFAULT

GIB = 1 << 30
MIB = 1 << 20
GRACE_MS = 2_000


class Count(Int):  # type: ignore[type-arg]
    """A whole number with a lower bound; ``None`` (where allowed) means unset. Errors name the fix."""

    def __init__(self, default: int | None, *, minimum: int = 1, unit: str = "", **kwargs: Any) -> None:
        super().__init__(default, allow_none=default is None or kwargs.pop("allow_none", False), **kwargs)
        self.minimum, self.unit = minimum, unit

    def validate(self, obj: Any, value: Any) -> int | None:
        unset = ", or None for none" if self.allow_none else ""
        if value is None and self.allow_none:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(str(self.name), f"{value!r} is not a number", f"Give a whole number{unset}")
        if value < self.minimum:
            raise ConfigError(
                str(self.name), f"{value!r} is below {self.minimum}", f"Use at least {self.minimum}{unset}"
            )
        return int(value)


class Seconds(Float):  # type: ignore[type-arg]
    def validate(self, obj: Any, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(str(self.name), f"{value!r} is not a number", "Give a number of seconds")
        if value <= 0:
            raise ConfigError(str(self.name), f"{value!r} is not above 0", "Give a number of seconds above 0")
        return float(value)


class Flag(Bool):  # type: ignore[type-arg]
    def validate(self, obj: Any, value: Any) -> bool:
        if not isinstance(value, bool):
            raise ConfigError(str(self.name), f"{value!r} is not True or False", "Pass a bool")
        return value


class Choice(Enum):  # type: ignore[type-arg]
    def validate(self, obj: Any, value: Any) -> str:
        choices = tuple(self.values or ())
        if value not in choices:
            raise ConfigError(str(self.name), f"{value!r} is not one of {', '.join(choices)}", "Pick one of them")
        return str(value)


class DeviceList(List):  # type: ignore[type-arg]
    """``auto``, ``none`` (a plain string is taken as a list of one), or a list of /dev paths."""

    def validate(self, obj: Any, value: Any) -> list[str]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value) or not value:
            raise ConfigError(str(self.name), f"{value!r} is not auto, none or a list of paths", "Give one of them")
        why = devices.check_setting(value)
        if why is not None:
            raise ConfigError(str(self.name), why, "Give auto, none, or a list of device paths such as /dev/nvidia0")
        return list(value)


class IvraloSettings(Configurable):  # type: ignore[misc]
    """Settings of every ivralo kernel, whoever starts it."""

    workspace = Unicode(
        None,
        allow_none=True,
        config=True,
        help="Folder the kernel runs in and may write to. None: the folder the host starts the kernel in "
        "(for JupyterLab, the notebook's folder).",
    )
    role = Choice(
        names.ROLES,
        default_value=names.ROLE_SPECIALIST,
        config=True,
        help="specialist, or readonly (every write refused).",
    )
    audience = Choice(
        AUDIENCES,
        default_value=PERSON,
        config=True,
        help="Who reads the kernel's refusals: person (a notebook, a console: the refusal names what and why, "
        "and what the person can do) or agent (an agent's tool: it also tells the agent to stop and say so).",
    )
    surface = Choice(
        names.SURFACES,
        default_value=names.SURFACE_PROJECT,
        config=True,
        help="Where the kernel's Python runs. project: the interpreter with its installed packages. hermetic: "
        "the standard library and ivralo's helpers only (other imports are refused, naming both surfaces), "
        "no exec, eval, compile or __import__ (refused before the cell runs), writes only to the kernel's "
        "scratch folder (its TMPDIR, removed with it), no %pip. Both run in the same sandbox, under the same "
        "deadline, memory limits and egress policy. The ivralo-hermetic kernelspec sets it.",
    )
    code_gate = Flag(
        False,
        config=True,
        help="The static code gate: each cell is checked against code_gate_modules and the code_gate_denied_* "
        "lists before it runs, on the host (denied code never starts a worker) and again in the kernel. A "
        "denial is a SecurityError naming the rule. A convenience for agents that want it, not a boundary: "
        "the runtime guards are. Off by default.",
    )
    code_gate_modules = List(
        Unicode(),
        None,
        allow_none=True,
        config=True,
        help=f'Top-level modules the code gate lets code import. "{STDLIB}" stands for the standard library '
        f"less the modules that reach outside Python ({', '.join(REACHES_OUTSIDE)}); name one of those, or "
        f'a package such as "numpy", to add it. None: {list(DEFAULT_MODULES)}.',
    )
    code_gate_denied_names = List(
        Unicode(),
        None,
        allow_none=True,
        config=True,
        help=f"Names the code gate refuses wherever code uses them. None: {', '.join(DEFAULT_DENIED_NAMES)}.",
    )
    code_gate_denied_attributes = List(
        Unicode(),
        None,
        allow_none=True,
        config=True,
        help="Attributes the code gate refuses (also as getattr's constant string). None: "
        f"{', '.join(DEFAULT_DENIED_ATTRIBUTES)}.",
    )
    code_gate_denied_calls = List(
        Unicode(),
        None,
        allow_none=True,
        config=True,
        help="Calls the code gate refuses, by dotted name through the code's import aliases (os.system). "
        "None: os.system, os.popen, the os.exec* and os.spawn* family, os.fork, os.kill, importlib.import_module, "
        "sys._getframe and the builtins module's eval, exec, compile and __import__.",
    )
    deadline_ms = Count(
        None,
        config=True,
        help="Per-execution deadline in ms, for every client (a browser tab as well as an agent). At the "
        "deadline the cell is interrupted (if interrupt_before_kill); if it has not ended after "
        "interrupt_grace_ms, the kernel's whole process tree is killed. None: no deadline.",
    )
    interrupt_before_kill = Flag(
        True, config=True, help="Interrupt first at the deadline, so the namespace can survive."
    )
    interrupt_grace_ms = Count(
        GRACE_MS,
        config=True,
        help=f"How long an interrupted cell gets to end, in ms, before the tree is killed. Default: {GRACE_MS}, "
        "or half the deadline when that is shorter (a 1 s deadline needs no flag more); a value given must be "
        "below the deadline.",
    )

    @default("interrupt_grace_ms")
    def _grace_within_the_deadline(self) -> int:
        deadline = self.deadline_ms
        return GRACE_MS if deadline is None else max(1, min(GRACE_MS, deadline // 2))

    memory_limit_bytes = Count(
        None,
        config=True,
        help="RLIMIT_DATA of the kernel, in bytes: a larger allocation raises MemoryError in the cell. "
        "None: half of the machine's memory.",
    )
    memory_soft_limit_bytes = Count(
        None, config=True, help="Tree RSS that earns a warning on the next result, in bytes. None: none."
    )
    memory_hard_limit_bytes = Count(
        None,
        config=True,
        help="Tree memory at which the tree is killed, in bytes: RSS and what it holds outside RSS "
        "(files on its tmpfs mounts, memfds, shared memory). None: none.",
    )
    tmpfs_size_bytes = Count(
        None,
        config=True,
        help="The size of each of the sandbox's scratch tmpfs mounts (/tmp, /var/tmp, /dev/shm), in bytes: a "
        "write beyond it fails with ENOSPC. None: memory_hard_limit_bytes, else an eighth of the machine's memory.",
    )
    memory_cgroup = Choice(
        names.MEMORY_CGROUP_MODES,
        default_value="auto",
        config=True,
        help="A cgroup v2 memory cgroup of its own for each kernel's tree, whose limit (memory_hard_limit_bytes, "
        "else memory_limit_bytes) the Linux kernel enforces on every page: its RSS, tmpfs files, memfds and "
        "/dev/shm. auto: where cgroup v2's memory controller is delegated to this user (a systemd Delegate=yes "
        "scope, or root's own v2 hierarchy), else the observer counts them (cgroup v1 is never used); required: "
        "a kernel that cannot have one does not start; off: the observer alone.",
    )
    rlimit_nofile = Count(None, config=True, help="RLIMIT_NOFILE of the kernel. None: leave the inherited limit.")
    landlock = Flag(
        True,
        config=True,
        help="Apply the Landlock write floor (Linux >= 5.13): the OS refuses writes outside the workspace "
        "from any process of the kernel's tree. Off only to diagnose.",
    )
    landlock_network = Flag(
        False,
        config=True,
        help="In the fallback (no OS sandbox), Landlock's TCP rule (Linux >= 6.7, ABI 4) always lets the "
        "kernel's tree connect only to the host's egress proxy and the kernel's own links; this adds the "
        "ports of the hosts in hosts.allow (80 and 443 for a host listed without a port), for direct links "
        "such as a database driver's. Fixed when the kernel starts: a host allowed later on another port "
        "needs a restart. The rule knows ports, not addresses. Off when landlock is off.",
    )
    fallback_reads = List(
        Unicode(),
        [],
        config=True,
        help="Without a sandbox, Landlock lets the kernel's tree read only a list of trees (the system's, "
        "the interpreter's, the workspace, the home folder's entries but Jupyter's runtime folder, the "
        "config home and the credential stores; docs/security.md). Absolute folders to add to it.",
    )
    fallback_read_floor = Flag(
        True,
        config=True,
        help="Without a sandbox, restrict reads to the list above (Landlock, Linux >= 5.13). Off: every "
        "process of the kernel's tree reads other kernels' connection files and the credential stores.",
    )
    sandbox = Choice(
        names.SANDBOX_MODES,
        default_value="auto",
        config=True,
        help="The OS sandbox (bubblewrap) each kernel lives in. auto: used where it can be built, else the "
        "kernel runs with the Python guards and Landlock only, and says so; required: a kernel that cannot "
        "have it does not start; off: never (the Python guards and Landlock only, as in the fallback).",
    )
    tool_files = List(
        Unicode(),
        list(TOOL_FILES_DEFAULT),
        config=True,
        help="Files and folders in the workspace that other tools run or read by themselves (an editor's "
        "tasks, direnv, CI, git hooks): read-only in the sandbox, like .git, .ivralo and databases.json, "
        "whether they exist at start or not (a missing one gets an empty folder as a placeholder while a "
        "kernel runs). The defaults and why each is there: docs/workspace-files.md. A name that is a link "
        "is closed at its target.",
    )
    devices = DeviceList(
        Unicode(),
        [devices.AUTO],
        config=True,
        help="Devices the kernel may use besides its null device and terminals (bound into the sandbox, and "
        "opened past Landlock's write floor). auto: the GPUs present (/dev/nvidia*, /dev/dri, /dev/kfd); "
        "none: no other device; or a list of paths under /dev. docs/security.md says what a GPU exposes.",
    )
    history_cap_bytes = Count(
        256 * MIB,
        config=True,
        help="The most bytes the workspace's history of overwritten files keeps (oldest pruned first).",
    )
    history_cap_count = Count(
        1000,
        config=True,
        help="The most copies the workspace's history of overwritten files keeps (oldest pruned first).",
    )
    credential_stores = List(
        Unicode(),
        list(CREDENTIAL_STORES),
        config=True,
        help="The person's credential stores (relative to the home folder, or absolute): empty in the "
        "sandbox, refused by the read guard without it. Code reaches services through the broker.",
    )
    observer_poll_ms = Count(500, config=True, help="How often the kernel's process tree is sampled, in ms.")
    stall_window_ms = Count(5_000, config=True, help="CPU flat this long while busy: the verdict is 'stalled'.")
    replace_killed_kernel = Flag(
        True,
        config=True,
        help="After the watchdog kills a kernel (deadline, memory), answer the cell it was running with the "
        "reason and start a fresh kernel on the same ports, so the host's restarter does not count a "
        "death. Off for hosts that replace workers themselves (the agent API).",
    )
    spares = Count(
        0,
        minimum=0,
        config=True,
        help="Warm spare kernels a Jupyter server keeps per workspace and kernelspec, already sandboxed and "
        "guarded: opening a notebook takes one and another starts in the background. Each idles at about "
        "a kernel's memory (doctor says how much); 0, the default, keeps none. Only sandboxed kernels are "
        "kept (a spare is handed over by relaying the new kernel's ports to its own sockets). Filled after "
        "the first kernel of a workspace starts. Agents' pool: prewarm_pool_size.",
    )
    spare_idle_ttl_seconds = Seconds(
        1800.0,
        config=True,
        help="A spare kernel nobody took this long is ended (its whole tree), in seconds; the next kernel of "
        "its workspace starts the pool again.",
    )
    host_memory_reserve_bytes = Count(
        512 * MIB,
        minimum=0,
        config=True,
        help="Memory the host keeps free: no new worker or spare kernel starts, and spares are evicted, below it.",
    )
    grants = List(
        Unicode(),
        config=True,
        help='Broker grants of kernels started here: "databases" for queries on databases.json, and an '
        'operation group such as "photos" for API calls. An agent Session names its own grants instead.',
    )
    operations_file = Unicode(
        None,
        allow_none=True,
        config=True,
        help="An apis.json with more broker operations, besides the config home's (its URL templates decide "
        "where credentials go: keep it where code in the kernel cannot write). None: only the config home's.",
    )

    def check(self) -> None:
        """The rules between settings, once all of them are known."""
        deadline, grace = self.deadline_ms, self.interrupt_grace_ms
        if deadline is not None and self.interrupt_before_kill and grace >= deadline:
            raise ConfigError(
                "interrupt_grace_ms",
                f"{grace} is not below deadline_ms={deadline}",
                "Make the grace after an interrupt shorter than the deadline itself",
            )
        soft, hard = self.memory_soft_limit_bytes, self.memory_hard_limit_bytes
        if soft is not None and hard is not None and soft > hard:
            raise ConfigError(
                "memory_soft_limit_bytes",
                f"{soft} is above memory_hard_limit_bytes={hard}",
                "The soft limit warns before the hard limit kills: make it the smaller one",
            )

    def gate_rules(self) -> GateRules | None:
        """The code gate's rules, or None when the gate is off."""
        if not self.code_gate:
            return None

        def given(value: list[str] | None, default: tuple[str, ...]) -> tuple[str, ...]:
            return default if value is None else tuple(value)

        return GateRules(
            modules=given(self.code_gate_modules, DEFAULT_MODULES),
            denied_names=given(self.code_gate_denied_names, DEFAULT_DENIED_NAMES),
            denied_attributes=given(self.code_gate_denied_attributes, DEFAULT_DENIED_ATTRIBUTES),
            denied_calls=given(self.code_gate_denied_calls, DEFAULT_DENIED_CALLS),
        )

    def kernel_settings(self) -> dict[str, Any]:
        """Every setting of the kernel itself (what a provisioner is configured with), by name."""
        return {name: plain_value(getattr(self, name)) for name in sorted(kernel_setting_names())}


class IvraloAgent(IvraloSettings):
    """Settings of the agent API's kernels and of the pool that keeps them (``WorkerConfig``'s model)."""

    # The worker reference's defaults: an agent's call always ends, and a big frame earns a hint.
    deadline_ms = Count(60_000, allow_none=True, config=True, help=IvraloSettings.deadline_ms.help)
    memory_soft_limit_bytes = Count(
        4 * GIB, allow_none=True, config=True, help=IvraloSettings.memory_soft_limit_bytes.help
    )
    replace_killed_kernel = Flag(False, config=True, help=IvraloSettings.replace_killed_kernel.help)
    audience = Choice(AUDIENCES, default_value=AGENT, config=True, help=IvraloSettings.audience.help)

    project = Unicode(
        None,
        allow_none=True,
        config=True,
        help="A project folder whose interpreter the kernel runs (the project surface): a uv project's .venv "
        "(pyvenv.cfg says uv), else a Poetry project's environment (poetry env info -p, with poetry on PATH), "
        "else a .venv or venv folder, else python3 on PATH; the first match wins, and kernel_info and doctor "
        "say which. An interpreter without ivralo-kernel or ipykernel gets ivralo's own packages after its "
        "site-packages (same Python minor only). None: ivralo's own interpreter. Jupyter's hosts: "
        "ivralo-kernel install --project PATH.",
    )
    bootstrap_timeout_ms = Count(
        60_000, config=True, help="How long a new worker gets to answer its first kernel_info, in ms."
    )
    namespace_timeout_ms = Count(
        10_000, config=True, help="How long a namespace request (get_var, ...) may take, in ms."
    )
    transfer_cap_bytes = Count(
        None,
        config=True,
        help="The most bytes one get_var/get_dataframe may bring from the kernel: the size the kernel "
        "declares is checked against it before the host reserves any memory (what the kernel says is not "
        "trusted). None: the kernel's memory limit (memory_limit_bytes, or half the machine's memory).",
    )
    max_workers = Count(8, config=True, help="The most workers the pool runs at once.")
    prewarm_pool_size = Count(0, minimum=0, config=True, help="Spare workers kept started and ready.")
    idle_ttl_seconds = Seconds(1800.0, config=True, help="A worker unused this long is ended, in seconds.")

    @classmethod
    def section_names(cls) -> list[str]:
        # An agent's kernel is started by the provisioner: its section applies, below IvraloAgent's.
        wide: list[str] = super().section_names()
        return [*wide[:-1], PROVISIONER_SECTION, wide[-1]]

    def check(self) -> None:
        super().check()
        if self.project is not None and self.surface == names.SURFACE_HERMETIC:
            raise ConfigError(
                "project",
                "the hermetic surface sees the standard library and ivralo's helpers, never a project's packages",
                'Use surface="project" with a project, or leave project out',
            )
        if self.prewarm_pool_size > self.max_workers:
            raise ConfigError(
                "prewarm_pool_size",
                f"{self.prewarm_pool_size} is above max_workers={self.max_workers}",
                "Prewarm at most max_workers spares",
            )


PROVISIONER_SECTION = "IvraloProvisioner"


class JupyterHostSettings(IvraloSettings):
    """What a kernel started by Jupyter's hosts gets, outside a provisioner: ``ivralo-kernel config``'s
    view of the provisioner, and a raw launch's (VS Code's) settings."""

    @classmethod
    def section_names(cls) -> list[str]:
        return [*super().section_names()[:-1], PROVISIONER_SECTION]


def every_setting() -> set[str]:
    return set(IvraloAgent.class_trait_names(config=True))


def kernel_setting_names() -> set[str]:
    return set(IvraloSettings.class_trait_names(config=True))


def plain_value(value: Any) -> Any:
    """A setting's value as JSON carries it (a tuple as a list)."""
    return list(value) if isinstance(value, (list, tuple)) else value
