"""[supervisor] ``python -m ivralo_kernel.supervisor -f CONNECTION_FILE``: the kernelspec's argv."""

import sys

from ivralo_kernel.supervisor.handover import hand_over_a_raw_launch

if __name__ == "__main__":
    hand_over_a_raw_launch(sys.argv[1:])
    from ivralo_kernel.supervisor.run import main

    sys.exit(main())
