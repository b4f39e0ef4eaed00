"""[protocol] The exception tree shared by every room. Each class sits under the nearest builtin,
so code that catches ``ValueError`` or ``RuntimeError`` keeps working::

    IvraloError
     ├── ConfigError(ValueError)            a setting is wrong; names the field and the fix
     ├── KernelSpecError(ValueError)        an install request cannot be honoured
     ├── WorkerBootstrapError(RuntimeError) a kernel did not become ready; names pid, budget, log
     ├── GuardRefusal(PermissionError)      a guard refused an operation; names what and why
     └── TrustGateError(ImportError)        the folder is not trusted, so its own code is not imported
"""

from __future__ import annotations

from ivralo_kernel.protocol import audience


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
