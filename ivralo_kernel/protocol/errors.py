"""[protocol] The exception tree shared by every room. Each class sits under the nearest builtin,
so code that catches ``ValueError`` or ``RuntimeError`` keeps working. Every error ivralo raises on
purpose is an ``IvraloError``; the host's API exports each one (``ivralo_kernel.host``)::

    IvraloError
     ├── ConfigError(ValueError)                  a setting is wrong; names the field and the fix
     ├── KernelSpecError(ValueError)              an install request cannot be honoured
     ├── WorkerBootstrapError(RuntimeError)       a kernel did not become ready; names pid, budget, log
     │    └── InterpreterError                    host.interpreters: a project's Python cannot run the kernel
     ├── GuardRefusal(PermissionError)            a guard refused an operation; names what and why
     ├── SecurityError(PermissionError)           the code gate or the hermetic surface refused code
     │                                            (in the kernel also IPython's InputRejected, which stops a cell)
     ├── TrustGateError(ImportError)              the folder is not trusted, so its own code is not imported
     ├── HermeticImportError(ModuleNotFoundError) the hermetic surface imports the standard library only
     ├── WorkerPoolExhaustedError(RuntimeError)   host.pool: every allowed worker is in use
     ├── HostMemoryError(MemoryError)             host.pool: too little memory to start another worker
     ├── NamespaceTimeoutError(TimeoutError)      host.namespace: a namespace request did not answer in time
     ├── NamespaceWorkerLostError(RuntimeError)   host.namespace: the worker ended during a namespace request
     ├── ArrowMissingError(ImportError)           host.dataplane: pyarrow is not installed where it is needed
     ├── UnsupportedValueError(TypeError)         host.dataplane: the value cannot leave the kernel as data
     ├── TransferRefusedError(ValueError)         host.dataplane: a transfer's size or data is refused
     ├── HistoryError                             host.history_store: a copy cannot be found, read or restored
     │    └── NewerChangeError                    the file changed after the change the copy undoes
     ├── GatewayError                             host.gateway: the gateway refused a request, or is not there
     └── AttachError                              host.attach: a connection file cannot be used"""

from __future__ import annotations

import ivralo_kernel.protocol.audience as audience  # the module, not this package (which imports this one)


class IvraloError(Exception):
    """Base of every error ivralo-kernel raises on purpose."""


class ConfigError(IvraloError, ValueError):
    """A configuration value is invalid. The message names the field and how to fix it."""

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field = field
        super().__init__(f"{field}: {problem}. {fix}")


class KernelSpecError(IvraloError, ValueError):
    """A kernelspec cannot be installed as asked."""


class WorkerBootstrapError(IvraloError, RuntimeError):
    """A kernel process did not become ready."""


class GuardRefusal(IvraloError, PermissionError):
    """A guard refused an operation. Code that catches ``PermissionError`` keeps working.

    Every part is required: which guard, what was attempted, on what, why, and what to do instead.
    The message tells the code to stop and say so to the person, not to look for another way.
    """

    def __init__(self, *, guard: str, operation: str, target: str, why: str, instead: str) -> None:
        self.guard, self.operation, self.target = guard, operation, target
        message = audience.addressed(f"ivralo {guard}: {operation} {target!r} refused: {why}. {instead}")
        super().__init__(13, message)  # errno EACCES, like the OS's own refusal

    def __str__(self) -> str:
        return str(self.args[1])


class TrustGateError(IvraloError, ImportError):
    """A module that lives in an untrusted workspace was imported."""

    def __init__(self, message: str, *, name: str | None = None) -> None:
        super().__init__(audience.addressed(message), name=name)


class SecurityError(IvraloError, PermissionError):
    """Code refused before it ran: the static code gate, or the hermetic surface's builtins rule.

    The message names the rule (the setting that holds it) and what it matched.
    """

    def __init__(self, message: str, *, rule: str) -> None:
        self.rule = rule
        super().__init__(13, message)

    def __str__(self) -> str:
        return str(self.args[1])

    def _render_traceback_(self) -> list[str]:
        """IPython's hook for an exception's own traceback (IPython need not be imported to offer it):
        the sentence alone, since no line of the cell ran and the frames are IPython's and ours."""
        return [f"{SecurityError.__name__}: {self}"]


class HermeticImportError(IvraloError, ModuleNotFoundError):
    """A module that is not on the hermetic surface was imported; the message names both surfaces."""

    def __init__(self, module: str) -> None:
        super().__init__(hermetic_import_message(module), name=module)


def hermetic_import_message(module: str) -> str:
    return (
        f"No module named {module!r} on the hermetic surface, which sees only the standard library and "
        f'ivralo\'s helpers (the ivralo-hermetic kernel, Session(surface="hermetic")). Installed packages are on '
        f'the project surface: switch to the ivralo kernel, or use Session(surface="project").'
    )
