"""[host] The old raw-launch module (``python -m ivralo_kernel.host.raw_launch``), kept for kernel.json
files installed before host/ had rooms: it runs ``ivralo_kernel.host.jupyter.raw_launch``."""

import runpy

if __name__ == "__main__":
    runpy.run_module("ivralo_kernel.host.jupyter.raw_launch", run_name="__main__", alter_sys=True)
