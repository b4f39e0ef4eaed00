"""[supervisor] ``python -m ivralo_kernel.supervisor -f CONNECTION_FILE``: the kernelspec's argv."""

import sys

from ivralo_kernel.protocol.sandbox.platform_support import exit_unless_linux

if __name__ == "__main__":
    exit_unless_linux()  # the kernelspec's argv: a raw launch (VS Code) on macOS or Windows ends here
    from ivralo_kernel.supervisor.handover import hand_over_a_raw_launch

    hand_over_a_raw_launch(sys.argv[1:])
    from ivralo_kernel.supervisor.run import main

    sys.exit(main())
