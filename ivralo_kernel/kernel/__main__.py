"""[kernel] ``python -P -B -m ivralo_kernel.kernel -f CONNECTION_FILE`` (started by the supervisor)."""

from ivralo_kernel.protocol.sandbox.platform_support import exit_unless_linux

if __name__ == "__main__":
    exit_unless_linux()
    from ivralo_kernel.kernel.launcher import main

    main()
