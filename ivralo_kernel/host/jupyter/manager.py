"""[host] ``IvraloKernelManager``: the agent-facing kernel manager.

It is jupyter_client's ``AsyncKernelManager`` with the ``ivralo`` kernelspec as its default and a
way to run a kernelspec that is not installed (``Session`` builds its own, with its settings in
the provisioner's config). Enforcement lives in ``IvraloProvisioner``, so it holds for every host.
"""

from __future__ import annotations

from typing import Any

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from traitlets import Instance, Unicode

from ivralo_kernel.host.jupyter.kernelspec import kernel_spec_dict
from ivralo_kernel.protocol import names


class _OneSpecManager(KernelSpecManager):  # type: ignore[misc]
    """Answers every lookup with one in-memory spec."""

    spec = Instance(KernelSpec)

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        return self.spec


class IvraloKernelManager(AsyncKernelManager):  # type: ignore[misc]
    """jupyter_client's kernel manager for the ivralo kernel, used by the agent API (``Session``'s
    workers): its kernels start through ``IvraloProvisioner``, and its pool keeps the spares."""

    kernel_name = Unicode(names.KERNEL_NAME)
    ivralo_agent_host = True  # its WorkerPool keeps the agent API's spares: the provisioner's pool stays out

    @classmethod
    def for_spec(cls, spec: dict[str, Any], **kwargs: Any) -> IvraloKernelManager:
        """A manager for a kernelspec given as a ``kernel.json`` dict (installed or not)."""
        kernel_spec = KernelSpec(resource_dir="", **spec)
        return cls(kernel_spec_manager=_OneSpecManager(spec=kernel_spec), kernel_name=names.KERNEL_NAME, **kwargs)

    @classmethod
    def for_settings(
        cls, python: str | None = None, env: dict[str, str] | None = None, **provisioner_config: Any
    ) -> IvraloKernelManager:
        """``env``: the kernelspec's own (an interpreter's private path and its description)."""
        return cls.for_spec(kernel_spec_dict(python=python, provisioner_config=provisioner_config, env=env))
