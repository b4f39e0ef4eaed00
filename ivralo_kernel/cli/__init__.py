"""[cli] The ``ivralo-kernel`` command."""

from ivralo_kernel.cli.app import main

__all__ = ["main"]
