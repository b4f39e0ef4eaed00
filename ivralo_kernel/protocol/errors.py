"""[protocol] The exception tree shared by every room. Each class sits under the nearest builtin,
so code that catches ``ValueError`` or ``RuntimeError`` keeps working::

    IvraloError
     ├── ConfigError(ValueError)            a setting is wrong; names the field and the fix
     ├── KernelSpecError(ValueError)        an install request cannot be honoured
     └── WorkerBootstrapError(RuntimeError) a kernel did not become ready; names pid, budget, log
"""

from __future__ import annotations


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
