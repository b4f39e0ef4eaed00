"""[kernel] ``python -P -B -m ivralo_kernel.kernel -f CONNECTION_FILE`` (started by the supervisor)."""

from ivralo_kernel.kernel.launcher import main

if __name__ == "__main__":
    main()
