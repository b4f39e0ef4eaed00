"""The parent-death signal fires when the launching *thread* exits: that must not end the kernel."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from jupyter_client import AsyncKernelManager
from jupyter_client.blocking.client import BlockingKernelClient
from kernel_helpers import execute


def test_kernel_survives_the_exit_of_the_thread_that_started_it(workspace: Path) -> None:
    km = AsyncKernelManager(kernel_name="ivralo")

    async def start_and_wait_until_ready() -> None:
        await km.start_kernel(cwd=str(workspace))
        client = km.client()
        client.start_channels()
        await client.wait_for_ready(timeout=60)  # by now the supervisor has asked for the signal
        client.stop_channels()

    launcher = threading.Thread(target=lambda: asyncio.run(start_and_wait_until_ready()))
    launcher.start()
    launcher.join()  # the thread that forked the supervisor is gone: Linux sent it the death signal
    kc = BlockingKernelClient(**km.get_connection_info(session=True))
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        assert execute(kc, "print('alive')").stdout == "alive\n"
        assert km.provisioner is not None and km.provisioner.process.poll() is None
    finally:
        kc.stop_channels()
        asyncio.run(km.shutdown_kernel(now=True))
