"""[cli] The ``ivralo-kernel`` command."""

from __future__ import annotations

from ivralo_kernel.protocol.sandbox.platform_support import exit_unless_linux


def main(argv: list[str] | None = None) -> int:
    exit_unless_linux()  # before the host's modules, which import Linux-only ones
    from ivralo_kernel.cli.app import main as app_main

    return app_main(argv)


__all__ = ["main"]
