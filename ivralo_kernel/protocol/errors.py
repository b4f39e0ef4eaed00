"""[protocol] The exception tree shared by every room. Each class sits under the nearest builtin,
so code that catches ``ValueError`` or ``RuntimeError`` keeps working::

    IvraloError
     ├── ConfigError(ValueError)            a setting is wrong; names the field and the fix
     ├── KernelSpecError(ValueError)        an install request cannot be honoured
     ├── WorkerBootstrapError(RuntimeError) a kernel did not become ready; names pid, budget, log
     ├── GuardRefusal(PermissionError)      a guard refused an operation; names what and why
     ├── SecurityError(PermissionError)     the code gate (or the hermetic surface) refused code before it ran
 ├── TrustGateError(ImportError)        the folder is not trusted, so its own code is not imported
 └── HermeticImportError(ModuleNotFoundError)  the hermetic surface imports the standard library only
"""

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
