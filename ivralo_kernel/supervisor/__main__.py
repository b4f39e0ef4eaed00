"""[supervisor] ``python -m ivralo_kernel.supervisor -f CONNECTION_FILE``: the kernelspec's argv."""

import sys

from ivralo_kernel.supervisor.run import main

if __name__ == "__main__":
    sys.exit(main())
