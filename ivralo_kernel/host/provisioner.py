"""[host] The old import path of ``IvraloProvisioner``, kept for older installs' entry point:
the class lives in ``ivralo_kernel.host.jupyter.provisioner``."""

from ivralo_kernel.host.jupyter.provisioner import IvraloProvisioner

__all__ = ["IvraloProvisioner"]
