"""[cli] ``python -m ivralo_kernel`` is the ``ivralo-kernel`` command."""

from ivralo_kernel.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
