"""[kernel] The Jupyter kernel process: the launcher (``python -m ivralo_kernel.kernel``) and
``IvraloKernel``.

Importing this package must not import ipykernel: the launcher installs the guards first. The
kernel class is therefore loaded on first attribute access.
"""

from __future__ import annotations

from typing import Any

__all__ = ["IvraloKernel"]


def __getattr__(name: str) -> Any:
    if name == "IvraloKernel":
        from ivralo_kernel.kernel.kernel import IvraloKernel

        return IvraloKernel
    raise AttributeError(name)
